"""``GET /v1/models`` and ``GET /v1/models/{id}``: keyed requests, observed like relay requests.

These endpoints authenticate with an API key and tell its holder which models it may use, so
they belong in the audit log as much as a completion does: a refused key (401), an unknown or
forbidden model (404) and a listing that was served each leave a record. They go through the
same observer life cycle as the relay (:mod:`gateway.relay.records`), minus the admission hooks:

* ``on_request`` hooks when the request arrives;
* a refusal (wrong method, bad key, unknown model) ends the request: only ``on_end`` runs, so
  the audit log writes one ``request.denied`` record;
* an answer runs every ``on_start`` first (the audit log makes ``request.started`` durable, or
  answers 503 ``audit_unavailable`` and nothing is disclosed), then ``on_end``
  (``request.completed``); the end of the body is held back until every ``end_recorded`` gate
  says the completion is durable, as for a relayed response.

``/v1/models/{id}`` takes any name the key may send for a model (configured name, alias, the
backend's served name, which may contain ``/``); an unknown model and a model the key may not
use are the same 404 (no oracle).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

from gateway.auth import authorization_of, bearer_token
from gateway.errors import GatewayError, MethodNotAllowed, ModelNotFound
from gateway.h1.asgi_io import Receive, Responder, Scope, Send, amend_undelivered, delivered
from gateway.relay.records import RequestRecord
from gateway.state import GatewayState

__all__ = ["MODELS_PATH", "handle", "is_models_path", "model_entry"]

_log = logging.getLogger(__name__)

MODELS_PATH = "/v1/models"
_PREFIX = MODELS_PATH + "/"


def is_models_path(path: str) -> bool:
    """Whether ``path`` is served here (``/v1/models`` or ``/v1/models/<id>``)."""
    return path == MODELS_PATH or (path.startswith(_PREFIX) and len(path) > len(_PREFIX))


def model_entry(name: str, aliases: Sequence[str], created: int) -> dict[str, Any]:
    """One model object of the OpenAI ``GET /v1/models`` shape, plus its ``aliases``."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "sovereign-gateway",
        "aliases": list(aliases),
    }


def _answer(state: GatewayState, scope: Scope, record: RequestRecord, created: int) -> Any:
    """The response body for an authorised request; raises the refusal otherwise."""
    if scope["method"] != "GET":
        raise MethodNotAllowed(f"Method not allowed on {scope['path']}.")
    principal = state.authenticator.authenticate(
        bearer_token(authorization_of(scope["headers"])), scope)
    record.identify(principal.key_id, principal.team, principal.data_class)
    if principal.identity is not None:  # gateway.identity: audited like a relay request
        record.identity = principal.identity.audit_fields()
    router = state.router
    path: str = scope["path"]
    if path == MODELS_PATH:
        return {
            "object": "list",
            "data": [
                model_entry(name, router.client_names(pool, principal.may_use), created)
                for name, pool in router.pools.items()
                if principal.may_use(name)
            ],
        }
    model_id = path[len(_PREFIX):]
    record.describe(model_id, False)
    pool = router.resolve(model_id, principal.may_use)
    if pool is None or not principal.may_use(pool.model.name):
        raise ModelNotFound(f"The model '{model_id}' does not exist.", param="model")
    record.describe(model_id, False, pool.model.name, pool.upstream_name)
    return model_entry(pool.model.name, router.client_names(pool, principal.may_use), created)


async def handle(
    state: GatewayState, scope: Scope, receive: Receive, send: Send, created: int
) -> None:
    """Serve one ``/v1/models`` request (see module docstring).

    Args:
        state: The request snapshot of the gateway state.
        scope, receive, send: The ASGI request.
        created: Unix time in seconds reported as each model's ``created``.
    """
    t0 = time.perf_counter()
    record = RequestRecord.for_scope(scope)
    hooks = state.hooks
    for on_request in hooks.on_request:
        on_request(record, scope["headers"])
    on_start_headers = hooks.on_response_start

    def response_start(headers: list[tuple[bytes, bytes]]) -> None:
        for hook in on_start_headers:
            hook(record, headers)

    out = Responder(send, record.request_id,
                    on_start=response_start if on_start_headers else None,
                    hold_end=bool(hooks.end_recorded))
    try:
        body = _answer(state, scope, record, created)
        for on_start in hooks.on_start:
            await on_start(record)  # may refuse (audit store down): nothing is disclosed
        payload = json.dumps(body, separators=(",", ":")).encode()
        record.ended("ok")
        await out.start(200, [(b"content-type", b"application/json"),
                              (b"content-length", str(len(payload)).encode())])
        await out.body(payload, more=False)
    except GatewayError as exc:
        record.failed("denied" if exc.status in (401, 403, 503) else "invalid", exc.code,
                      exc.reason)
        if not out.started:
            await out.error(exc)
    finally:
        extensions = scope.get("extensions") or {}
        status, sent = delivered(record, out, extensions)  # a client gone: what it got
        record.sent(status, sent, round((time.perf_counter() - t0) * 1000.0, 3))
        await hooks.ended(record)
        if state.settings.logging.access_log:
            state.access.request(record)
        if hooks.end_recorded:
            recorded = all([gate(record) for gate in hooks.end_recorded])
            await out.release(recorded)
            if recorded and hooks.undelivered:
                await amend_undelivered(hooks.undelivered, record, extensions)
