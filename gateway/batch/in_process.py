"""One request through the relay in process: an ASGI request handed to
:func:`gateway.relay.pipeline.handle` (no socket, no HTTP connection to ourselves), under a
state whose authenticator answers with the batch owner's principal (:class:`FixedPrincipal`).

:meth:`gateway.batch.runner.BatchRunner.call` re-authorises the owner and builds the headers;
this module only speaks ASGI to the relay and collects its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping, MutableMapping
from typing import Any, NamedTuple

from gateway.auth import Principal
from gateway.errors import AuthenticationFailed
from gateway.relay import pipeline as relay
from gateway.state import GatewayState

__all__ = ["FixedPrincipal", "RelayAnswer", "relay_in_process"]


class RelayAnswer(NamedTuple):
    """The relay's answer to one batch request.

    Attributes:
        status: HTTP status (500 when the relay answered nothing).
        request_id: Its ``x-request-id`` (empty when none).
        body: The response body.
        retry_after_s: ``retry-after-ms`` or ``retry-after``, whichever came first, seconds;
            ``None`` without one.
        should_retry: The ``x-should-retry`` header (``false``: waiting cannot help, e.g. a
            spent budget); ``None`` without one.
    """

    status: int
    request_id: str
    body: bytes
    retry_after_s: float | None
    should_retry: bool | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class FixedPrincipal:
    """An authenticator that answers with one principal (a batch's owner)."""

    principal: Principal

    def authenticate(self, token: str | None,
                     scope: Mapping[str, Any] | None = None) -> Principal:
        """The owner's principal for any token (the relay's request carries one).

        Raises:
            AuthenticationFailed: No token (never the case for a batch's request).
        """
        if token is None:
            raise AuthenticationFailed("missing_credential")
        return self.principal


async def relay_in_process(state: GatewayState, url: str, body: bytes,
                           headers: list[tuple[bytes, bytes]]
                           ) -> RelayAnswer:
    """POST ``body`` to ``url`` through the relay under ``state``, with ``headers``.

    Returns:
        The status, request id, body and retry headers (:class:`RelayAnswer`); 500 and an
        empty request id when the relay answered nothing.
    """
    scope: dict[str, Any] = {
        "type": "http", "method": "POST", "path": url, "raw_path": url.encode(),
        "headers": headers, "query_string": b"", "client": None, "extensions": {},
        "http_version": "1.1", "scheme": "http",
    }
    sent = False
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never  # no client to go away: the request ends when the relay ends it
        return {"type": "http.disconnect"}

    status = 500
    request_id = ""
    retry_after: float | None = None
    should_retry: bool | None = None
    chunks: list[bytes] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status, request_id, retry_after, should_retry
        if message["type"] == "http.response.start":
            status = int(message["status"])
            for name, value in message.get("headers", ()):
                name = bytes(name).lower()
                if name == b"x-request-id":
                    request_id = bytes(value).decode("latin-1")
                elif name == b"x-should-retry":
                    should_retry = bytes(value).strip().lower() != b"false"
                elif name in (b"retry-after-ms", b"retry-after") and retry_after is None:
                    with contextlib.suppress(ValueError):
                        scale = 1000.0 if name == b"retry-after-ms" else 1.0
                        retry_after = float(bytes(value)) / scale
        elif message["type"] == "http.response.body":
            chunks.append(bytes(message.get("body", b"")))

    try:
        await relay.handle(state, scope, receive, send)
    finally:
        never.cancel()
    return RelayAnswer(status, request_id, b"".join(chunks), retry_after, should_retry)
