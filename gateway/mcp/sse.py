"""Incremental Server-Sent Events framing for relayed MCP streams (WHATWG HTML, "Server-sent
events", event stream interpretation: events end at a blank line, ``data:`` lines join with
``\\n``). Events are relayed one by one as they complete; none is held beyond its own end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SseEvent", "SseSplitter", "with_data"]


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One complete event: its raw bytes (relayed as they were) and its joined data."""

    raw: bytes
    data: str | None


class SseSplitter:
    """Splits a byte stream into complete events.

    Args:
        max_event_bytes: Largest event (bytes); a longer one raises ``ValueError``.
    """

    def __init__(self, max_event_bytes: int) -> None:
        self._buf = bytearray()
        self._max = max_event_bytes

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Add ``chunk``; return the events it completed.

        Raises:
            ValueError: An event is longer than ``max_event_bytes``.
        """
        self._buf += chunk
        events: list[SseEvent] = []
        while True:
            end, sep = -1, 0
            for marker in (b"\r\n\r\n", b"\n\n", b"\r\r"):
                at = self._buf.find(marker)
                if at != -1 and (end == -1 or at < end):
                    end, sep = at, len(marker)
            if end == -1:
                break
            raw = bytes(self._buf[:end + sep])
            del self._buf[:end + sep]
            events.append(SseEvent(raw, _data(raw[:end])))
        if len(self._buf) > self._max:
            raise ValueError(f"an SSE event is longer than {self._max} bytes")
        return events


def with_data(raw: bytes, data: bytes) -> bytes:
    """The event ``raw`` (complete, as :meth:`SseSplitter.feed` returns it) with its data
    replaced by ``data`` (one line, no line break), its other fields (``event``, ``id``,
    ``retry``, comments) kept in order."""
    kept = [line for line in re.split(rb"\r\n|\r|\n", raw)
            if line and not (line.startswith(b"data:") or line == b"data")]
    return b"\n".join([*kept, b"data: " + data]) + b"\n\n"


def _data(block: bytes) -> str | None:
    lines: list[str] = []
    text = block.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
    for line in text.split("\n"):
        if line.startswith("data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(" ") else value)
        elif line == "data":
            lines.append("")
    return "\n".join(lines) if lines else None
