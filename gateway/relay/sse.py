"""Incremental Server-Sent Events scanning for token usage.

Source of the framing rules: the WHATWG HTML standard, "Server-sent events" (§9.2.5): lines end
with CRLF, LF or CR; an empty line dispatches the event; ``data:`` may be followed by one optional
space; several ``data:`` lines are joined with LF. vLLM and OpenAI put token usage into the last
JSON event (``"choices": []`` plus ``"usage"``) when ``stream_options.include_usage`` is set.

The scanner never decodes an event unless its bytes contain ``"usage"``: the hot path is a few
``bytes.rfind`` calls and one ``bytes.count`` per network chunk. It also counts the ``data:``
lines of the complete events it passed on (a line start is the stream start, an event start, or
a byte after LF: JSON payloads escape their newlines, so ``data:`` inside a string never follows
a raw LF) in the first ``SAMPLE_BYTES`` of a stream, then extrapolates by bytes (later chunks
cost one integer addition). One vLLM stream event carries about one token of one choice, so the
count estimates the completion tokens of a stream that ended without usage (client gone,
backend broke off).
Events split across chunks and multi-byte UTF-8 split across chunks are handled because only
complete events (bytes up to a blank line) are decoded or counted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_EVENT_BYTES",
    "SSEUsageScanner",
    "Usage",
    "usage_from_body",
    "usage_from_body_end",
    "usage_from_mapping",
]

# An empty line: a line terminator immediately followed by another. Atomic groups stop "\r\n"
# from being read as two terminators ("\r" then "\n").
_BLANK_LINE = re.compile(rb"(?>\r\n|\n|\r)(?>\r\n|\n|\r)")
_BOUNDARIES = (b"\r\n\r\n", b"\n\n", b"\n\r\n", b"\r\r")
_USAGE = b'"usage"'
_DONE = b"[DONE]"
# The event that ends a stream: a ``data`` line whose value starts with ``[DONE]``, at the start
# of a line (a region scanned here starts at an event start). ``[DONE]`` inside an event's JSON
# (generated text) is no end: JSON escapes its line breaks.
_DONE_LINE = re.compile(rb"(?:^|[\r\n])data: ?\[DONE\]")
_DATA = b"data:"
_LF_DATA = b"\ndata:"
#: Bytes of complete events whose data lines are counted exactly (about 400 vLLM chat events);
#: beyond them the count is extrapolated from the bytes relayed.
SAMPLE_BYTES = 64 * 1024
#: Longest incomplete event held (bytes). A Responses API ``response.completed`` event carries
#: the whole output and the usage, so this is far above a long generation; an event past it is
#: no usage event: it is passed on and no longer held (a replica that never ends its event
#: would otherwise be held whole, and copied and rescanned on every chunk).
MAX_EVENT_BYTES = 4 * 1024 * 1024
# Below this many bytes an incomplete event is one piece, joined with the next chunk and searched
# whole (cheapest for the usual event split across two reads); above, its pieces are kept and
# only the new bytes searched (linear however the event is cut).
_JOIN_BELOW = 4 * 1024


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one request (``input`` = prompt, ``output`` = completion)."""

    input_tokens: int
    output_tokens: int


def usage_from_mapping(obj: Any) -> Usage | None:
    """Read usage from a response object (chat, completions, embeddings or responses API)."""
    if not isinstance(obj, dict):
        return None
    usage = obj.get("usage")
    if not isinstance(usage, dict):
        inner = obj.get("response")
        usage = inner.get("usage") if isinstance(inner, dict) else None
        if not isinstance(usage, dict):
            return None
    tin = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    tout = usage.get("completion_tokens", usage.get("output_tokens", 0))
    if not isinstance(tin, int) or not isinstance(tout, int):
        return None
    return Usage(tin, tout or 0)


def usage_from_body(body: bytes) -> Usage | None:
    """Usage from a complete non-streamed JSON response body, or ``None``."""
    if _USAGE not in body:
        return None
    try:
        return usage_from_mapping(json.loads(body))
    except ValueError:
        return None


_USAGE_KEY = re.compile(rb'"usage"\s*:\s*')


def usage_from_body_end(tail: bytes) -> Usage | None:
    """Usage from the last bytes of a JSON response body too long to keep whole, or ``None``.

    Reads the last ``"usage": {...}`` object in ``tail`` (vLLM and OpenAI write ``usage`` after
    ``choices``, near the end). A ``"usage"`` inside a string value cannot match: its quotes
    are escaped there.
    """
    keys = list(_USAGE_KEY.finditer(tail))
    if not keys:
        return None
    try:
        obj, _ = json.JSONDecoder().raw_decode(tail[keys[-1].end():].decode("utf-8", "replace"))
    except ValueError:
        return None
    return usage_from_mapping({"usage": obj})


def _ends(region: bytes, end: int) -> bool:
    """Whether ``region[:end]`` (starting at an event start) holds the ``data: [DONE]`` line."""
    return region.find(_DONE, 0, end) >= 0 and _DONE_LINE.search(region, 0, end) is not None


def _event_data(event: bytes) -> bytes | None:
    """The joined ``data:`` payload of one complete event, or ``None`` without data lines."""
    parts = []
    for line in event.splitlines():
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts) if parts else None


def _last_boundary_end(buf: bytes) -> int:
    """Index just after the last blank line in ``buf`` (0 when there is none).

    A ``"\\r\\n\\r"`` at the very end is not a boundary yet: the next chunk may complete it
    to ``"\\r\\n\\r\\n"``, so it waits (no pattern below matches it).
    """
    if buf.endswith(b"\n\n"):  # the common case, a chunk of whole LF events: no search
        return len(buf)
    end = 0
    for pattern in _BOUNDARIES:
        i = buf.rfind(pattern)
        if i >= 0 and i + len(pattern) > end:
            end = i + len(pattern)
    return end


def _first_boundary_end(buf: bytes) -> int:
    """Index just after the first blank line in ``buf`` (0 when there is none; the patterns of
    :func:`_last_boundary_end`)."""
    end = 0
    for pattern in _BOUNDARIES:
        i = buf.find(pattern)
        if i >= 0 and (end == 0 or i + len(pattern) < end):
            end = i + len(pattern)
    return end


def _events_with(region: bytes, needle: bytes) -> list[tuple[int, int]]:
    """``(start, end)`` of each event in ``region`` whose bytes contain ``needle``.

    Work is proportional to the number of matching events, not to the number of events: the
    usage event is one of hundreds.
    """
    spans: list[tuple[int, int]] = []
    pos = region.find(needle)
    while pos >= 0:
        start = 0
        for pattern in _BOUNDARIES:
            i = region.rfind(pattern, 0, pos)
            if i >= 0 and i + len(pattern) > start:
                start = i + len(pattern)
        m = _BLANK_LINE.search(region, pos)
        end = m.end() if m else len(region)
        spans.append((start, end))
        pos = region.find(needle, end)
    return spans


class SSEUsageScanner:
    """Relay an SSE stream byte-for-byte while finding the usage event.

    Args:
        drop_usage_only: Remove the usage-only event (``"choices": []`` with ``usage``) from the
            bytes handed back, because the gateway forced ``include_usage`` on upstream but the
            client did not ask for it. Only then are incomplete events held back (up to
            :data:`MAX_EVENT_BYTES`: a longer one is handed back and not inspected).

    Attributes:
        usage: The last usage seen, if any.
        done: Whether ``data: [DONE]`` was seen.
        data_events: ``data:`` lines counted in the complete events of the first
            ``SAMPLE_BYTES`` (LF or CRLF line ends; a multi-line event counts once per line).
        at_boundary: Whether everything handed back so far ends at an event boundary (an error
            event can then be appended without corrupting a half-sent event).
    """

    __slots__ = (
        "_drop", "_edge", "_held", "_pieces", "_sampled", "_tail", "_unsampled", "at_boundary",
        "data_events", "done", "usage",
    )

    def __init__(self, drop_usage_only: bool = False) -> None:
        self._drop = drop_usage_only
        # The incomplete event at the end of what was fed, and its length in _held: one piece
        # (_tail) while short; past _JOIN_BELOW its pieces (_pieces, joined once it is complete,
        # not on every chunk) and its last three bytes (_edge: a blank line completed by the
        # next chunk starts at most three bytes back). _held is -1 inside an event longer than
        # MAX_EVENT_BYTES, which is passed on until its end.
        self._tail = b""
        self._held = 0
        self._pieces: list[bytes] = []
        self._edge = b""
        self.usage: Usage | None = None
        self.done = False
        self.at_boundary = True
        self.data_events = 0
        self._sampled = 0
        self._unsampled = 0

    @property
    def estimated_output_tokens(self) -> int:
        """Completion tokens estimated from the events relayed: data lines minus ``[DONE]``.

        Exact count over the first ``SAMPLE_BYTES`` of complete events, plus the later bytes
        times the sampled events per byte. About one token per event and choice for vLLM
        streams (the first event of each chat choice carries only the role, so this errs by at
        most one per choice); 0 when nothing was relayed. Meant for streams that ended without
        a usage event.
        """
        events = self.data_events
        if self._unsampled and self._sampled:
            events += round(self._unsampled * self.data_events / self._sampled)
        return max(0, events - (1 if self.done else 0))

    @property
    def held_bytes(self) -> int:
        """Bytes of the incomplete event held now (at most :data:`MAX_EVENT_BYTES` plus one
        chunk)."""
        return max(0, self._held)

    def feed(self, chunk: bytes) -> bytes:
        """Take the next network chunk; return the bytes to send to the client now."""
        held = self._held
        if (not held and chunk.endswith(b"\n\n") and chunk.find(_USAGE) < 0
                and chunk.find(_DONE) < 0):
            # The common chunk, whole LF events with neither marker, after a boundary: what
            # the general path below does for it, without its calls (one per relayed event).
            # (find, not ``in``: ``bytes in bytes`` first tries the needle as an integer and
            # formats and clears a TypeError each time, a tenth of a relayed event's work.)
            if self._sampled < SAMPLE_BYTES:
                self.data_events += chunk.count(_LF_DATA) + chunk.startswith(_DATA)
                self._sampled += len(chunk)
            else:
                self._unsampled += len(chunk)
            self.at_boundary = True
            return chunk
        if not held:
            buf = chunk
            end = _last_boundary_end(buf)
        elif 0 < held <= _JOIN_BELOW - len(chunk):  # a short split event (the usual one)
            buf = self._tail + chunk
            end = _last_boundary_end(buf)
        else:  # a long event (only its new bytes searched), or one past the limit
            buf, end = self._long(chunk)
            if end < 0:
                return buf  # still incomplete: what to send now
        if end < len(buf):
            self._tail = buf[end:]
            self._held = len(buf) - end
        elif held:
            self._tail, self._held = b"", 0
        if end:
            if self._sampled < SAMPLE_BYTES:
                # Complete events only; buf starts at an event start (stream start or after
                # the previous blank line), so a region's first line is matched by startswith
                # (a region holding a blank line is longer than "data:": no bound needed).
                self.data_events += buf.count(_LF_DATA, 0, end) + buf.startswith(_DATA)
                self._sampled += end
            else:
                self._unsampled += end
        if self._drop:
            out = self._filter(buf[:end]) if end else b""
            self.at_boundary = True
            return out
        if end:
            # find() with bounds: no copy of the chunk on the common path.
            if buf.find(_USAGE, 0, end) >= 0:
                self._scan(buf[:end])
            elif _ends(buf, end):
                self.done = True
        self.at_boundary = not self._held  # (-1: inside a long event, not at a boundary)
        return chunk

    def _long(self, chunk: bytes) -> tuple[bytes, int]:
        """Feed a long or too long event: ``(complete bytes, end of the last event)`` once a
        blank line came, else ``(bytes to send now, -1)``."""
        if self._held > 0 and not self._pieces:  # it just grew long: keep its pieces from now
            self._pieces, self._edge, self._tail = [self._tail], self._tail[-3:], b""
        probe = self._edge + chunk
        found = _last_boundary_end(probe)
        if not found:
            return self._hold(chunk), -1
        if self._held < 0:
            return self._skipped(probe, chunk), -1
        self._pieces.append(chunk)
        buf = b"".join(self._pieces)
        self._pieces = []
        return buf, len(buf) - len(probe) + found

    def _hold(self, chunk: bytes) -> bytes:
        """``chunk`` has no end of event: hold it (or pass it on past the limit)."""
        self._edge = (self._edge + chunk)[-3:]
        if self._held < 0:
            self.at_boundary = False
            return chunk
        self._pieces.append(chunk)
        self._held += len(chunk)
        if self._held <= MAX_EVENT_BYTES:
            if self._drop:
                return b""  # held back: it may be the usage-only event
            self.at_boundary = False
            return chunk
        # Too long to be a usage event: pass it on (what was held back too) and stop holding.
        out = b"".join(self._pieces) if self._drop else chunk
        self._pieces, self._held = [], -1
        self.at_boundary = False
        return out

    def _skipped(self, probe: bytes, chunk: bytes) -> bytes:
        """The end of an event that was too long: pass it on, then scan the rest anew."""
        end = max(0, _first_boundary_end(probe) - (len(probe) - len(chunk)))
        self._held, self._edge = 0, b""
        rest = self.feed(chunk[end:]) if end < len(chunk) else b""
        if not rest:
            self.at_boundary = end == len(chunk) or self._drop
        return chunk[:end] + rest

    def finish(self) -> bytes:
        """End of the upstream body: return what is still held back (drop mode only)."""
        tail = b"".join(self._pieces) if self._pieces else self._tail
        self._tail, self._pieces, self._held = b"", [], 0
        if not tail:
            return b""
        if self._sampled < SAMPLE_BYTES:
            self.data_events += tail.count(_LF_DATA) + tail.startswith(_DATA)
            self._sampled += len(tail)
        else:
            self._unsampled += len(tail)
        if self._drop:
            kept = self._filter(tail)
            self.at_boundary = kept == b""
            return kept
        if _USAGE in tail:
            self._scan(tail)
        return b""

    def _scan(self, region: bytes) -> None:
        """Inspect only the events that mention usage (or end the stream)."""
        for start, end in _events_with(region, _USAGE):
            self._inspect(region[start:end])
        if _ends(region, len(region)):
            self.done = True

    def _inspect(self, event: bytes) -> bool:
        """Update state from one event; True when it is a usage-only event."""
        data = _event_data(event)
        if data is None:
            return False
        if data == _DONE:
            self.done = True
            return False
        if _USAGE not in data:
            return False
        try:
            obj = json.loads(data)
        except ValueError:
            return False
        usage = usage_from_mapping(obj)
        if usage is None:
            return False
        self.usage = usage
        return isinstance(obj, dict) and obj.get("choices") == []

    def _filter(self, region: bytes) -> bytes:
        """``region`` without its usage-only events (complete events, or the final tail)."""
        if _ends(region, len(region)):
            self.done = True
        if region.find(_USAGE) < 0:
            return region
        out = bytearray()
        kept = 0
        for start, end in _events_with(region, _USAGE):
            if self._inspect(region[start:end]):
                out += region[kept:start]
                kept = end
        if kept == 0:
            return region
        out += region[kept:]
        return bytes(out)
