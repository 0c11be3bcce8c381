"""HTTP endpoints of the Batch API (OpenAI-compatible ``/v1/files`` and ``/v1/batches``).

Every endpoint authenticates the key like the relay does; a key sees only its own files and
batches (another key's id answers 404, as an unknown one does). Uploads are bounded by
``batch.max_file_bytes`` before the body is read (``Content-Length`` is required); an input
file is checked line by line when a batch is created from it, and the error names the line.
References: https://platform.openai.com/docs/api-reference/files and /batch.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.audit.errors import AuditUnavailable
from gateway.auth import Principal, authorization_of, bearer_token
from gateway.batch.errors import (
    BatchError,
    FileTooLarge,
    NotFound,
    RequestTooLarge,
    StorageQuotaExceeded,
)
from gateway.batch.events import (
    BATCH_CANCEL_REQUESTED,
    BATCH_CREATED,
    BATCH_FILE_CREATED,
    BATCH_FILE_DELETED,
    batch_trace_id,
)
from gateway.batch.jsonl import ENDPOINTS, parse_input
from gateway.batch.owner import check_endpoint_credential, owner_fields, record_identity
from gateway.batch.runner import BatchRunner, new_id
from gateway.batch.store import FINAL, OwnerLimits, OwnerUsage
from gateway.errors import ServiceUnavailable
from gateway.relay.strict_json import StrictJsonError, loads_strict
from gateway.state import gateway_state

__all__ = ["RUNNER_KEY", "batch_routes"]

RUNNER_KEY = "sovereign_gateway_batch"
"""Key of the :class:`BatchRunner` in the ASGI lifespan state."""

_FORM_OVERHEAD = 64 * 1024  # multipart boundaries and the other fields of an upload
MAX_CREATE_BYTES = 64 * 1024
"""Largest ``POST /v1/batches`` body, bytes: a file id, the endpoint, the window and metadata
within OpenAI's limits (16 pairs of at most 64 + 512 characters) fit many times over."""
METADATA_MAX_PAIRS, METADATA_MAX_KEY, METADATA_MAX_VALUE = 16, 64, 512
"""OpenAI's limits on a batch's ``metadata``: pairs, key and value length (characters)."""


async def _bounded_json(request: Request, limit: int) -> Any:
    """The request's JSON body, read up to ``limit`` bytes (an announced length above it is
    refused before any byte is read).

    Raises:
        RequestTooLarge: 413, the body is above ``limit``.
        BatchError: 400, the body is not strict JSON (:func:`gateway.relay.strict_json.
            loads_strict`: repeated keys, lone surrogates, NaN, deep nesting...), naming what
            and where.
    """
    declared = request.headers.get("content-length")
    too_large = RequestTooLarge(f"The request body is larger than {limit} bytes.")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    try:
        return loads_strict(bytes(body))
    except StrictJsonError as exc:
        raise BatchError(f"The request body is not valid JSON: {exc}.") from exc


def _check_metadata(metadata: Any) -> None:
    """Refuse ``metadata`` outside OpenAI's shape: an object of at most 16 string pairs, keys of
    at most 64 characters, values of at most 512.

    Raises:
        BatchError: 400 naming ``metadata``.
    """
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise BatchError("'metadata' must be an object.", param="metadata")
    if len(metadata) > METADATA_MAX_PAIRS:
        raise BatchError(f"'metadata' holds more than {METADATA_MAX_PAIRS} pairs.",
                         param="metadata")
    for key, value in metadata.items():
        if len(key) > METADATA_MAX_KEY:
            raise BatchError(f"'metadata' keys are at most {METADATA_MAX_KEY} characters.",
                             param="metadata")
        if not isinstance(value, str) or len(value) > METADATA_MAX_VALUE:
            raise BatchError(f"'metadata' values are strings of at most {METADATA_MAX_VALUE} "
                             "characters.", param="metadata")


def _runner(request: Request) -> BatchRunner:
    try:
        runner = request.scope["state"][RUNNER_KEY]
    except (KeyError, TypeError) as exc:
        raise NotFound("The Batch API is not enabled (no batch section).") from exc
    assert isinstance(runner, BatchRunner)
    return runner


def _caller(request: Request) -> Principal:
    """The caller, authenticated as the relay does: with the request's scope, so that
    ``identity.routes`` (per-path credentials) and client certificates apply here too."""
    token = bearer_token(authorization_of(request.scope["headers"]))
    return gateway_state(request).authenticator.authenticate(token, request.scope)


def _file_object(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "object": "file", "bytes": row["bytes"],
            "created_at": row["created_at"], "filename": row["filename"],
            "purpose": row["purpose"], "status": "processed", "expires_at": None,
            "status_details": None}


async def create_file(request: Request) -> Response:
    """``POST /v1/files`` (multipart: ``file``, ``purpose`` ``batch``)."""
    runner = _runner(request)
    who = _caller(request)
    limit = runner.settings.max_file_bytes
    declared = request.headers.get("content-length")
    if declared is None or not declared.isdigit():
        err = BatchError("A file upload needs a Content-Length header.", code="length_required")
        err.status = 411
        raise err
    if int(declared) > limit + _FORM_OVERHEAD:
        raise FileTooLarge(f"The upload of {declared} bytes is larger than the limit of {limit} "
                           "bytes (batch.max_file_bytes).", param="file")
    try:
        form = await request.form(max_files=1, max_fields=8)
    except HTTPException as exc:  # Starlette's answer to a malformed or oversized form
        raise BatchError(f"The upload is not valid multipart/form-data: {exc.detail}",
                         code="invalid_multipart", param="file") from exc
    try:
        purpose = form.get("purpose")
        if purpose != "batch":
            got = "missing" if purpose is None else f"got {str(purpose)[:32]!r}"
            raise BatchError(f"'purpose' must be 'batch' ({got}).", param="purpose")
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise BatchError("The upload has no 'file' part.", param="file")
        content = await upload.read(limit + 1)
        if len(content) > limit:
            raise FileTooLarge(f"The file is larger than the limit of {limit} bytes "
                               "(batch.max_file_bytes).", param="file")
        row = {"id": new_id("file-"), "owner": who.key_id, "purpose": "batch",
               "filename": (upload.filename or "upload.jsonl")[:255],
               "created_at": int(time.time())}
    finally:
        await form.close()
    limits = _limits(runner)
    usage = await runner.store.add_file(row, content, limits)
    if usage is not None:
        raise _quota_error(usage, limits, len(content))
    digest = await asyncio.to_thread(lambda: hashlib.sha256(content).hexdigest())
    try:
        await _record(runner, {"type": BATCH_FILE_CREATED, "file_id": row["id"],
                               "key_id": who.key_id, "purpose": "batch",
                               "bytes": len(content), "sha256": digest,
                               **record_identity(who)})
    except ServiceUnavailable:
        await runner.store.delete_file(str(row["id"]), who.key_id)  # none without its record
        raise
    return JSONResponse(_file_object({**row, "bytes": len(content)}))


def _limits(runner: BatchRunner) -> OwnerLimits:
    """The per-owner storage limits of the ``batch`` section."""
    return OwnerLimits(max_bytes=runner.settings.max_stored_bytes_per_owner,
                       max_files=runner.settings.max_files_per_owner)


async def _record(runner: BatchRunner, event: dict[str, Any]) -> None:
    """Make ``event`` durable in the audit log before the change it records is answered.

    Raises:
        ServiceUnavailable: 503 ``audit_unavailable``: the audit store cannot record now.
    """
    try:
        await runner.record(event)
    except AuditUnavailable as exc:
        raise ServiceUnavailable(f"The audit log cannot record now: {exc}",
                                 code="audit_unavailable") from exc


def _quota_error(usage: OwnerUsage, limits: OwnerLimits, size: int,
                 what: str = "upload", param: str = "file") -> StorageQuotaExceeded:
    """The refusal of an ``upload`` of ``size`` bytes (or a ``batch`` whose request rows are
    ``size`` bytes) the owner's ``usage`` has no room for."""
    stored = (f"this key already stores {usage.bytes} bytes in {usage.files} files "
              "(running batches included); delete files (DELETE /v1/files/{file_id}) or let "
              "its batches end to make room.")
    noun = "The upload" if what == "upload" else "The batch"
    if usage.files + 1 > limits.max_files:
        return StorageQuotaExceeded(
            f"{noun} would exceed the limit of {limits.max_files} files per key "
            f"(batch.max_files_per_owner): {stored}", param=param,
            code="file_count_quota_exceeded")
    return StorageQuotaExceeded(
        f"{noun} of {size} bytes would exceed the limit of {limits.max_bytes} bytes per key "
        f"(batch.max_stored_bytes_per_owner): {stored}", param=param)


async def retrieve_file(request: Request) -> Response:
    """``GET /v1/files/{file_id}``."""
    runner, who = _runner(request), _caller(request)
    file_id = request.path_params["file_id"]
    row = await runner.store.file(file_id, who.key_id)
    if row is None:
        raise NotFound(f"No such file: '{file_id}'.", param="file_id")
    return JSONResponse(_file_object(row))


async def file_content(request: Request) -> Response:
    """``GET /v1/files/{file_id}/content`` (the bytes, JSONL)."""
    runner, who = _runner(request), _caller(request)
    file_id = request.path_params["file_id"]
    content = await runner.store.content(file_id, who.key_id)
    if content is None:
        raise NotFound(f"No such file: '{file_id}'.", param="file_id")
    return Response(content, media_type="application/jsonl")


async def delete_file(request: Request) -> Response:
    """``DELETE /v1/files/{file_id}`` (the owner's file; another key's answers 404)."""
    runner, who = _runner(request), _caller(request)
    file_id = request.path_params["file_id"]
    if await runner.store.file(file_id, who.key_id) is None:
        raise NotFound(f"No such file: '{file_id}'.", param="file_id")
    await _record(runner, {"type": BATCH_FILE_DELETED, "file_id": file_id,
                           "key_id": who.key_id, **record_identity(who)})
    if not await runner.store.delete_file(file_id, who.key_id):
        raise NotFound(f"No such file: '{file_id}'.", param="file_id")
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


async def create_batch(request: Request) -> Response:
    """``POST /v1/batches`` (``input_file_id``, ``endpoint``, ``completion_window``)."""
    runner, who = _runner(request), _caller(request)
    params = await _bounded_json(request, MAX_CREATE_BYTES)
    if not isinstance(params, dict):
        raise BatchError("The request body must be a JSON object.")
    endpoint = params.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise BatchError(f"'endpoint' must be one of {', '.join(sorted(ENDPOINTS))}.",
                         param="endpoint")
    if params.get("completion_window") != "24h":
        raise BatchError("'completion_window' must be '24h'.", param="completion_window")
    check_endpoint_credential(who, gateway_state(request).settings.identity, endpoint)
    metadata = params.get("metadata")
    _check_metadata(metadata)
    file_id = params.get("input_file_id")
    content = (await runner.store.content(file_id, who.key_id)
               if isinstance(file_id, str) else None)
    if content is None:
        raise NotFound(f"No such file: '{file_id}'.", param="input_file_id")
    # A 100 MB file is seconds of CPU: off the event loop, so other requests are answered.
    requests = await asyncio.to_thread(parse_input, content, endpoint,
                                       runner.settings.max_requests)
    now = int(time.time())
    obj: dict[str, Any] = {
        "id": new_id("batch_"), "object": "batch", "endpoint": endpoint, "errors": None,
        "input_file_id": file_id, "completion_window": "24h", "status": "validating",
        "output_file_id": None, "error_file_id": None, "created_at": now,
        "in_progress_at": None, "expires_at": now + 24 * 3600, "finalizing_at": None,
        "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
        "cancelled_at": None,
        "request_counts": {"total": len(requests), "completed": 0, "failed": 0},
        "metadata": metadata,
    }
    lines = [(line, custom_id, endpoint, body) for line, custom_id, body in requests]
    owner = owner_fields(who, gateway_state(request).settings.identity)
    # The request rows are a copy of the input (kept until the batch ends, even when the
    # input file is deleted): they count toward the owner's storage like a file.
    limits = _limits(runner)
    usage = await runner.store.add_batch(obj, who.key_id, owner, lines, limits)
    if usage is not None:
        raise _quota_error(usage, limits, sum(len(x[3]) for x in lines), "batch",
                           "input_file_id")
    try:
        await _record(runner, {"type": BATCH_CREATED, "batch_id": obj["id"],
                               "key_id": who.key_id, "input_file_id": file_id,
                               "endpoint": endpoint, "requests": len(requests),
                               "trace_id": batch_trace_id(obj["id"]),
                               **record_identity(who)})
    except ServiceUnavailable:
        await runner.store.remove_batch(obj["id"])  # none without its record
        raise
    runner.start(obj["id"])
    return JSONResponse(obj)


async def retrieve_batch(request: Request) -> Response:
    """``GET /v1/batches/{batch_id}``."""
    runner, who = _runner(request), _caller(request)
    batch_id = request.path_params["batch_id"]
    obj = await runner.store.batch(batch_id, who.key_id)
    if obj is None:
        raise NotFound(f"No batch found with id '{batch_id}'.", param="batch_id")
    return JSONResponse(obj)


async def cancel_batch(request: Request) -> Response:
    """``POST /v1/batches/{batch_id}/cancel``."""
    runner, who = _runner(request), _caller(request)
    batch_id = request.path_params["batch_id"]
    obj = await runner.store.batch(batch_id, who.key_id)
    if obj is not None and obj["status"] not in FINAL and obj["status"] != "cancelling":
        await _record(runner, {"type": BATCH_CANCEL_REQUESTED, "batch_id": batch_id,
                               "key_id": who.key_id, "status": obj["status"],
                               **record_identity(who)})
    return JSONResponse(await runner.cancel(batch_id, who.key_id))


async def list_batches(request: Request) -> Response:
    """``GET /v1/batches`` (``after``, ``limit`` 1..100, default 20)."""
    runner, who = _runner(request), _caller(request)
    try:
        limit = int(request.query_params.get("limit", "20"))
    except ValueError as exc:
        raise BatchError("'limit' must be an integer.", param="limit") from exc
    if not 1 <= limit <= 100:
        raise BatchError("'limit' must be between 1 and 100.", param="limit")
    after = request.query_params.get("after")
    page = await runner.store.batches(who.key_id, after, limit + 1)
    data = page[:limit]
    return JSONResponse({"object": "list", "data": data,
                         "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None,
                         "has_more": len(page) > limit})


def batch_routes() -> list[Route]:
    """The Batch API's routes (added to the app's router by :func:`gateway.app.create_app`)."""
    return [
        Route("/v1/files", create_file, methods=["POST"]),
        Route("/v1/files/{file_id}", retrieve_file, methods=["GET"]),
        Route("/v1/files/{file_id}", delete_file, methods=["DELETE"]),
        Route("/v1/files/{file_id}/content", file_content, methods=["GET"]),
        Route("/v1/batches", create_batch, methods=["POST"]),
        Route("/v1/batches", list_batches, methods=["GET"]),
        Route("/v1/batches/{batch_id}", retrieve_batch, methods=["GET"]),
        Route("/v1/batches/{batch_id}/cancel", cancel_batch, methods=["POST"]),
    ]
