"""Run batches: each request through the gateway's own relay path, in process, in the flow
control ``batch`` class.

A request is handed to :func:`gateway.relay.pipeline.handle` as an ASGI request (no socket, no HTTP
connection to ourselves: :mod:`gateway.batch.in_process`), so it goes through the same
authorisation, policy, routing, quotas, flow control and audit as an interactive one. The
caller's key is not kept (only its digest is ever configured): the relay sees a snapshot of the
live state whose authenticator answers with the principal stored when the batch was created.
The priority header names ``batch.priority_class`` (a key may always lower its class).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

from gateway.audit.errors import AuditUnavailable
from gateway.batch.backends import open_batch_store
from gateway.batch.errors import NotCancellable, NotFound
from gateway.batch.events import (
    BATCH_FILE_CREATED,
    BATCH_FINISHED,
    BATCH_REQUEST_REFUSED,
    AuditSink,
    batch_trace_id,
)
from gateway.batch.in_process import FixedPrincipal, RelayAnswer, relay_in_process
from gateway.batch.owner import OwnerRevoked, reauthorise, stored_record_identity
from gateway.batch.settings import BatchSettings, store_location
from gateway.batch.slots import FairSlots, retriable
from gateway.batch.store import FINAL, BatchStore, BatchStoreUnavailable
from gateway.bounded import bounded
from gateway.config.settings import GatewaySettings
from gateway.errors import ServiceUnavailable
from gateway.state import LiveState

__all__ = ["BatchRunner", "new_id", "open_runner"]

_log = logging.getLogger(__name__)


def new_id(prefix: str) -> str:
    """A fresh object id such as ``batch_...`` or ``file-...``."""
    return prefix + secrets.token_hex(12)


class BatchRunner:
    """Runs every unfinished batch in the background; resumes them at start-up.

    Args:
        store: The batch database.
        cell: The gateway's live state (each request takes the current snapshot).
        settings: The ``batch`` section.
        audit: Where its audit events go (:mod:`gateway.batch.events`), ``None`` without an
            audit log.
    """

    def __init__(self, store: BatchStore, cell: LiveState, settings: BatchSettings,
                 audit: AuditSink | None = None) -> None:
        self.store = store
        self.cell = cell
        self.settings = settings
        self.audit = audit
        self._slots = FairSlots(settings.concurrency)  # round-robin between owners
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._me = secrets.token_hex(8)  # this runner's name in the batches' leases
        self._scan: asyncio.Task[None] | None = None

    async def startup(self) -> None:
        """Resume every batch a previous run left unfinished (and, every ``lease_s``, any
        whose runner stopped without giving it up).

        Raises:
            BatchStoreUnavailable: The database cannot be opened (the gateway does not start).
        """
        await self.store.open()
        await self._resume()
        self._scan = asyncio.get_running_loop().create_task(self._rescan())

    async def _resume(self) -> None:
        for batch_id in await self.store.unfinished():
            if batch_id not in self._tasks:
                self.start(batch_id)  # runs only if it gets the lease

    async def _rescan(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_s)
            try:
                await self._resume()
            except Exception:
                _log.exception("batch resume scan failed")

    async def shutdown(self) -> None:
        """Stop the running batches (requests without a stored answer run again on resume),
        give up their leases and close the database."""
        if self._scan is not None:
            self._scan.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scan
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.store.close()

    def start(self, batch_id: str) -> None:
        """Run the batch ``batch_id`` in the background."""
        task = asyncio.get_running_loop().create_task(self._run(batch_id))
        self._tasks[batch_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(batch_id, None))

    async def cancel(self, batch_id: str, owner: str) -> dict[str, Any]:
        """Ask the batch to stop: no new request is sent; it ends ``cancelled``.

        Raises:
            NotFound: No such batch of ``owner``.
            NotCancellable: It already ended.
        """
        obj = await self.store.batch(batch_id, owner)
        if obj is None:
            raise NotFound(f"No batch found with id '{batch_id}'.", param="batch_id")
        if obj["status"] in FINAL:
            raise NotCancellable(f"Batch '{batch_id}' is {obj['status']}: it cannot be cancelled.")
        if obj["status"] != "cancelling":
            obj["status"] = "cancelling"
            obj["cancelling_at"] = int(time.time())
            await self.store.save_batch(obj)
        if batch_id not in self._tasks:
            self.start(batch_id)
        return obj

    async def record(self, event: Mapping[str, Any]) -> None:
        """Append a Batch API event to the audit log and wait until it is durable (nothing
        when the gateway has no audit log).

        Args:
            event: ``{"type": "batch.<what>", ...}``: ids, counts and digests, never content.

        Raises:
            AuditUnavailable: It could not be recorded (the caller answers 503).
        """
        if self.audit is not None:
            await self.audit(event)

    async def _status(self, batch_id: str) -> str:
        obj = await self.store.batch(batch_id, None)
        return str(obj["status"]) if obj is not None else "failed"

    async def _run(self, batch_id: str) -> None:
        try:
            await self._run_leased(batch_id)
        except BatchStoreUnavailable as exc:  # taken up again at the next scan (lease_s)
            _log.error("batch %s stopped: %s", batch_id, exc.message)

    async def _run_leased(self, batch_id: str) -> None:
        now = time.time()
        if not await self.store.claim(batch_id, self._me, now,
                                       now + self.settings.lease_s):
            return  # another worker or pod runs it
        _log.info("running batch %s", batch_id)
        renew = asyncio.get_running_loop().create_task(self._renew(batch_id))
        try:
            await self._run_claimed(batch_id)
        finally:
            renew.cancel()
            # Also when cancelled at shutdown: the task's cancellation was delivered above.
            with contextlib.suppress(Exception):
                await self.store.release(batch_id, self._me)

    async def _renew(self, batch_id: str) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_s / 3)
            now = time.time()
            if not await self.store.claim(batch_id, self._me, now,
                                           now + self.settings.lease_s):
                _log.error("lost the lease on batch %s", batch_id)

    async def _run_claimed(self, batch_id: str) -> None:
        store = self.store
        obj = await store.batch(batch_id, None)
        if obj is None:
            return
        if obj["status"] == "validating":
            obj["status"] = "in_progress"
            obj["in_progress_at"] = int(time.time())
            await store.save_batch(obj)
        owner = await store.principal(batch_id)
        pending = await store.pending(batch_id)
        running: set[asyncio.Task[None]] = set()
        try:
            for line, custom_id, url, body in pending:
                await self._slots.acquire(str(owner.get("key_id")))
                if await self._status(batch_id) == "cancelling":
                    self._slots.release()
                    break
                task = asyncio.get_running_loop().create_task(
                    self._one(batch_id, owner, line, custom_id, url, body))
                running.add(task)
                task.add_done_callback(running.discard)
            if running:
                await asyncio.gather(*running)
        except asyncio.CancelledError:
            for task in running:
                task.cancel()
            raise
        await self._finalize(batch_id)

    async def _one(self, batch_id: str, owner: dict[str, Any], line: int, custom_id: str,
                   url: str, body: bytes) -> None:
        # Called holding a slot; a wait before a retry gives it back (another owner's request
        # may run meanwhile) and queues for one again, in turn with the other owners.
        held = True
        try:
            for attempt in range(self.settings.retries + 1):
                status, request_id, answer, wait_s, should_retry = await self.call(
                    owner, url, body, batch_id=batch_id, line=line, custom_id=custom_id)
                if attempt == self.settings.retries or not retriable(
                        status, answer, wait_s, should_retry, self.settings.retry_max_wait_s):
                    break
                if await self._status(batch_id) == "cancelling":
                    break
                self._slots.release()
                held = False
                await asyncio.sleep(min(wait_s if wait_s is not None else 0.5 * 2 ** attempt,
                                        self.settings.retry_max_wait_s))
                await self._slots.acquire(str(owner.get("key_id")))
                held = True
                if await self._status(batch_id) == "cancelling":
                    break  # cancelled while it waited: its last answer is its line
        finally:
            if held:
                self._slots.release()
        try:
            parsed: Any = json.loads(answer)
        except ValueError:
            parsed = answer.decode("utf-8", "replace")
        ok = 200 <= status < 300
        result: dict[str, Any] = {
            "id": new_id("batch_req_"), "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": parsed},
            "error": None,
        }
        if not ok:
            err = parsed.get("error") if isinstance(parsed, dict) else None
            result["error"] = {"code": (err or {}).get("code") or str(status),
                               "message": (err or {}).get("message") or str(parsed)[:500]}
        await self.store.answer(batch_id, line, ok, result)
        obj = await self.store.batch(batch_id, None)
        if obj is not None:
            obj["request_counts"] = dict(zip(("total", "completed", "failed"),
                                             await self.store.counts(batch_id),
                                             strict=True))
            await self.store.save_batch(obj)

    async def call(self, owner: dict[str, Any], url: str, body: bytes, *,
                   batch_id: str | None = None, line: int | None = None,
                   custom_id: str | None = None) -> RelayAnswer:
        """Send one request through the relay in process, as the batch's owner re-authorised
        under the configuration in force now (:func:`gateway.batch.owner.reauthorise`).

        With ``batch_id`` the request carries a ``traceparent`` whose trace id is the batch's
        (:func:`batch_trace_id`), so its audit records, spans and those of the batch's other
        requests form one ``gateway audit timeline --trace-id``.

        Args:
            owner: The owner fields stored with the batch.
            url: The batch's endpoint.
            body: The request body (JSON).
            batch_id: The batch the request belongs to (links its audit records).
            line: Its line in the input file (1-based; recorded when it is refused here).
            custom_id: Its ``custom_id`` (recorded when it is refused here).

        Returns:
            The relay's answer (:class:`RelayAnswer`: status, x-request-id, body, retry
            headers); an owner no longer allowed answers its :class:`OwnerRevoked` error
            (401, nothing sent) under a request id of its own, recorded as a
            ``batch.request_refused`` audit record (a 503 ``audit_unavailable``, retried,
            when that record cannot be written).
        """
        current = self.cell.current
        try:
            principal = reauthorise(owner, current.settings, url)
        except OwnerRevoked as err:
            request_id = secrets.token_hex(16)
            try:
                await self.record({
                    "type": BATCH_REQUEST_REFUSED, "request_id": request_id,
                    "batch_id": batch_id, "line": line, "custom_id": bounded(custom_id),
                    "key_id": owner.get("key_id"), "path": url, "status": err.status,
                    "code": err.code, "reason": err.message[:300],
                    "trace_id": batch_trace_id(batch_id) if batch_id else None,
                    **stored_record_identity(owner)})
            except AuditUnavailable as exc:
                unavailable = ServiceUnavailable(f"The audit log cannot record now: {exc}",
                                                 code="audit_unavailable")
                return RelayAnswer(503, request_id,
                                   json.dumps(unavailable.to_dict()).encode(), None)
            return RelayAnswer(err.status, request_id, json.dumps(err.to_dict()).encode(), None)
        state = dataclasses.replace(current, authenticator=FixedPrincipal(principal))
        headers = [(b"authorization", b"Bearer batch"), (b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        if batch_id is not None:
            headers.append((b"traceparent", f"00-{batch_trace_id(batch_id)}-"
                                            f"{secrets.token_hex(8)}-01".encode()))
        flow = state.settings.flow_control
        if flow.enabled and any(c.name == self.settings.priority_class for c in flow.classes):
            headers.append((flow.header.lower().encode("latin-1"),
                            self.settings.priority_class.encode("latin-1")))
        return await relay_in_process(state, url, body, headers)

    async def _finalize(self, batch_id: str) -> None:
        store = self.store
        obj = await store.batch(batch_id, None)
        if obj is None or obj["status"] in FINAL:
            return
        cancelling = obj["status"] == "cancelling"
        obj["status"] = "finalizing"
        obj["finalizing_at"] = int(time.time())
        await store.save_batch(obj)
        fields = await store.principal(batch_id)
        owner, who = fields["key_id"], stored_record_identity(fields)
        now = int(time.time())
        for ok, field in ((True, "output_file_id"), (False, "error_file_id")):
            lines = await store.results(batch_id, ok)
            if not lines:
                continue
            file_id = new_id("file-")
            content = ("\n".join(lines) + "\n").encode()
            row = {"id": file_id, "owner": owner, "purpose": "batch_output",
                   "filename": f"{batch_id}_{'output' if ok else 'error'}.jsonl",
                   "created_at": now}
            await store.add_file(row, content)
            obj[field] = file_id
            await self._record_quietly(batch_id, {
                "type": BATCH_FILE_CREATED, "file_id": file_id, "key_id": owner,
                "purpose": "batch_output", "batch_id": batch_id, "bytes": len(content),
                "sha256": hashlib.sha256(content).hexdigest(), **who})
        total, completed, failed = await store.counts(batch_id)
        obj["request_counts"] = {"total": total, "completed": completed, "failed": failed}
        obj["status"] = "cancelled" if cancelling else "completed"
        obj["cancelled_at" if cancelling else "completed_at"] = int(time.time())
        await store.save_batch(obj)
        # Its answers are in its output files (counted and deletable): the request rows, a
        # copy of the input counted toward the owner's storage, go now.
        await store.forget_requests(batch_id)
        await self._record_quietly(batch_id, {
            "type": BATCH_FINISHED, "batch_id": batch_id, "key_id": owner,
            "status": obj["status"], "completed": completed, "failed": failed,
            "output_file_id": obj.get("output_file_id"),
            "error_file_id": obj.get("error_file_id"), "trace_id": batch_trace_id(batch_id),
            **who})

    async def _record_quietly(self, batch_id: str, event: Mapping[str, Any]) -> None:
        """Record an event of a batch's end; an audit store that cannot record is logged (the
        batch's requests were each recorded, and its answers are not thrown away)."""
        try:
            await self.record(event)
        except AuditUnavailable as exc:
            _log.error("batch %s: its %s record was not written: %s", batch_id, event["type"],
                       exc)


def open_runner(settings: GatewaySettings, cell: LiveState,
                audit: AuditSink | None = None) -> BatchRunner | None:
    """The runner of the ``batch`` section over its store (opened by
    :meth:`BatchRunner.startup`), or ``None`` when it is off.

    Args:
        settings: The gateway's configuration.
        cell: The live state the batch's requests take.
        audit: Where the Batch API's events go (:mod:`gateway.batch.events`; the audit log's
            ``record_event``), ``None`` without an audit log.

    Raises:
        ConfigError: No store can be derived (see :func:`store_location`).
        AuditConfigError: ``audit.store_file`` cannot be read.
    """
    section = settings.batch
    if section is None or not section.enabled:
        return None
    where = settings.audit.store_url() if settings.audit is not None else None
    return BatchRunner(open_batch_store(store_location(section, where)), cell, section, audit)
