"""Raw ASGI plumbing of the simulator: bodies, JSON responses and the fault-aware SSE writer.

Every response carries ``x-simulator: vllm-sim``. Streams are ``text/event-stream`` with events
``data: <json>\\n\\n`` and a final ``data: [DONE]`` (Server-Sent Events, WHATWG HTML §9.2).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from vllm_sim.config import FaultSpec

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

SIM_HEADER = (b"x-simulator", b"vllm-sim")
JSON_TYPE = b"application/json"
SSE_TYPE = b"text/event-stream; charset=utf-8"
MAX_BODY_BYTES = 64 * 1024 * 1024


class SimulatedCrash(Exception):
    """Raised inside the ASGI send loop so that uvicorn drops the connection mid-response."""


async def read_body(receive: Receive) -> bytes | None:
    """Read the whole request body; None when the client disconnected first.

    Raises:
        ValueError: the body exceeds ``MAX_BODY_BYTES``.
    """
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ValueError("request body too large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def wait_disconnect(receive: Receive) -> None:
    """Return when the client has gone (or the response is complete)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _headers(
    content_type: bytes | None, extra: list[tuple[bytes, bytes]]
) -> list[tuple[bytes, bytes]]:
    if content_type is None:
        return [SIM_HEADER, *extra]
    return [(b"content-type", content_type), SIM_HEADER, *extra]


async def send_body(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes | None = JSON_TYPE,
    extra: list[tuple[bytes, bytes]] | None = None,
    fault: FaultSpec | None = None,
) -> None:
    """Send a complete (non-streamed) response.

    With fault ``die_mid_stream`` only the first half of the body is sent and the connection
    is dropped; with ``split_writes`` the body goes out in three writes.

    Raises:
        SimulatedCrash: fault ``die_mid_stream``.
    """
    headers = _headers(content_type, [*(extra or []), (b"content-length", b"%d" % len(body))])
    await send({"type": "http.response.start", "status": status, "headers": headers})
    mode = fault.mode if fault is not None else "none"
    if mode == "die_mid_stream":
        await send(
            {"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True}
        )
        raise SimulatedCrash("simulated crash in the middle of a response body")
    if mode == "split_writes" and fault is not None and len(body) >= 3:
        third = len(body) // 3
        for piece in (body[:third], body[third : 2 * third]):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            await asyncio.sleep(fault.split_delay_s)
        body = body[2 * third :]
    await send({"type": "http.response.body", "body": body, "more_body": False})


def split_points(event: bytes) -> list[int]:
    """Cut positions for ``split_writes``: inside ``data:``, inside a UTF-8 character, mid-JSON.

    Returns:
        Sorted offsets strictly between 0 and ``len(event)``.
    """
    cuts = {3, len(event) // 2}
    for i, byte in enumerate(event):
        if byte >= 0xC0:  # lead byte of a multi-byte UTF-8 sequence: cut right after it
            cuts.add(i + 1)
            break
    return sorted(c for c in cuts if 0 < c < len(event))


class SseWriter:
    """Writes SSE events to an ASGI ``send`` applying the active fault.

    Args:
        send: The ASGI send callable.
        fault: The fault of this request, or None.
    """

    def __init__(self, send: Send, fault: FaultSpec | None) -> None:
        self._send = send
        self._fault = fault
        mode = fault.mode if fault is not None else "none"
        self._split = mode == "split_writes"
        self._die_after = (
            fault.after_events if fault is not None and mode == "die_mid_stream" else -1
        )
        self._sep = b"\r\n\r\n" if mode == "crlf" else b"\n\n"
        self.events = 0

    async def start(self) -> None:
        """Send the response head (status 200, ``text/event-stream``)."""
        await self._send(
            {"type": "http.response.start", "status": 200, "headers": _headers(SSE_TYPE, [])}
        )

    async def event(self, payload: str) -> None:
        """Send one ``data:`` event.

        Raises:
            SimulatedCrash: fault ``die_mid_stream`` after ``after_events`` events.
        """
        if self.events == self._die_after:
            raise SimulatedCrash(f"simulated crash after {self.events} SSE events")
        data = b"data: " + payload.encode() + self._sep
        self.events += 1
        if self._split and self._fault is not None:
            start = 0
            for cut in split_points(data):
                await self._send(
                    {"type": "http.response.body", "body": data[start:cut], "more_body": True}
                )
                await asyncio.sleep(self._fault.split_delay_s)
                start = cut
            data = data[start:]
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def finish(self) -> None:
        """Send ``data: [DONE]`` and end the response.

        Raises:
            SimulatedCrash: fault ``die_mid_stream`` (also when the stream had fewer events).
        """
        await self.event("[DONE]")
        if self._die_after >= 0:
            raise SimulatedCrash("simulated crash before the end of the stream")
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})
