"""Masking what a model answers (``pii.responses: mask``), streamed or not.

A non-streamed JSON answer is masked whole before it is sent: every string under a ``content``
or ``text`` key (chat ``choices[].message.content``, completions ``choices[].text``, Responses
``output[].content[].text``) has its findings replaced by ``<ENTITY>``, and the
``Content-Length`` is that of the masked body.

A streamed answer is masked event by event with a bounded hold-back (:class:`StreamMask`). The
generated text of each choice (chat ``delta.content``, completions ``text``, Responses
``response.output_text.delta``) is appended to that choice's pending text; the pending text is
scanned together with the last ``hold`` characters already sent (left context: a context word
before an identifier still counts), and everything but its last ``hold`` characters is sent in
the event that brought it, masked (a finding that crosses that cut is held whole). An
identifier up to ``hold`` characters long split across events is therefore always seen whole
before any of it leaves; the client sees at most ``hold`` characters of text late. The held
text is sent, masked, in an added event (a copy of the choice's last text event) just before the
first event that is not a text delta of that choice (``finish_reason``, usage, ``[DONE]``,
``response.output_text.done``) or at the end of the stream. SSE framing, event order, event
names and the ``[DONE]``/usage handling of the relay are kept: only the JSON of events that
carry text is re-encoded. Full texts in later events (Responses ``*.done``,
``response.completed``) are masked whole.

A detector failure fails closed: the text it should have scanned is replaced by
``<UNSCANNED>`` and the record says so (``response_error``).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from typing import Any

from gateway.records import RequestRecord
from policy import PiiPolicy
from policy.pii.engine import Detector, Finding, iter_strings, mask

__all__ = ["UNSCANNED", "ResponseMasker", "StreamMask", "mask_json_body", "mask_value"]

#: What replaces text the detector failed on (fail closed).
UNSCANNED = "<UNSCANNED>"

_EVENT_END = re.compile(rb"\r?\n\r?\n")
_TEXT_KEYS = frozenset({"content", "text"})


def _spans(value: Any, path: str = "") -> list[tuple[str, str]]:
    """The ``(path, text)`` of every string under a ``content``/``text`` key."""
    return [(p, t) for p, t in iter_strings(value, path)
            if p.rsplit(".", 1)[-1] in _TEXT_KEYS]


def mask_value(detector: Detector, value: Any, counts: Counter[str]) -> Any:
    """``value`` (a JSON value) with findings in its ``content``/``text`` strings masked.

    Args:
        detector: the policy's detector.
        value: a decoded JSON answer or event.
        counts: gets one count per masked finding, by entity type.

    Raises:
        Exception: whatever the detector raises (the caller fails closed).
    """
    texts = _spans(value)
    if not texts:
        return value
    keep = {p for p, _ in texts}
    findings = [f for f in detector.scan(value) if f.path in keep]
    counts.update(f.entity for f in findings)
    return mask(value, findings)


def mask_json_body(detector: Detector, body: bytes, counts: Counter[str]) -> bytes:
    """A non-streamed JSON answer with its generated text masked (re-encoded only if it
    changed; a body that is not JSON is returned as it is)."""
    try:
        value = json.loads(body)
    except ValueError:
        return body
    masked = mask_value(detector, value, counts)
    if masked is value:
        return body
    return json.dumps(masked, ensure_ascii=False).encode("utf-8")


class _Pending:
    """One choice's text not yet sent, and the last event that carried its text."""

    __slots__ = ("ctx", "event", "text")

    def __init__(self) -> None:
        self.ctx = ""  # the last ``hold`` characters sent (scanned as left context only)
        self.text = ""  # received, not yet sent
        self.event: tuple[list[bytes], Any, tuple[Any, ...]] | None = None


class StreamMask:
    """Masks the generated text of an SSE stream as it passes (see the module docstring).

    ``feed`` takes the bytes the relay would send (after its usage scanner) and returns those
    to send instead; ``finish`` returns what is still held at the end of the stream.

    Args:
        pii: the policy's ``pii`` section (its detector is built already).
        hold: characters held back per choice (``pii.response_hold_chars``): the longest
            identifier found when split across events.
    """

    def __init__(self, pii: PiiPolicy, hold: int) -> None:
        self._detector = pii.load()
        self._hold = hold
        self._buf = b""
        self._pending: dict[tuple[Any, ...], _Pending] = {}
        self.counts: Counter[str] = Counter()
        self.error: str | None = None

    # -- SSE framing -------------------------------------------------------------------
    def feed(self, data: bytes) -> bytes:
        """Bytes to send for ``data`` (complete events only; a partial one waits)."""
        if not data:
            return b""
        buf = self._buf + data
        out: list[bytes] = []
        pos = 0
        for m in _EVENT_END.finditer(buf):
            out.append(self._event(buf[pos:m.start()], m.group()))
            pos = m.end()
        self._buf = buf[pos:]
        return b"".join(out)

    def finish(self) -> bytes:
        """What is held at the end of the stream: pending texts, then any partial event."""
        out = [self._flush(key) for key in list(self._pending)]
        if self._buf:
            out.append(self._event(self._buf, b""))
            self._buf = b""
        return b"".join(out)

    def _event(self, raw: bytes, end: bytes) -> bytes:
        lines = raw.split(b"\n")
        data_at = [i for i, line in enumerate(lines) if line.startswith(b"data:")]
        if len(data_at) != 1:
            return self._flush_all() + raw + end
        payload = lines[data_at[0]][5:].strip()
        if payload == b"[DONE]" or not payload.startswith(b"{"):
            return self._flush_all() + raw + end
        try:
            obj = json.loads(payload)
        except ValueError:
            return self._flush_all() + raw + end
        if not isinstance(obj, dict):
            return self._flush_all() + raw + end
        deltas = _text_deltas(obj)
        if deltas is None:  # not a pure text delta: send held text first, mask full texts
            before = self._flush_all()
            masked = self._mask_whole(obj)
            if masked is obj:
                return before + raw + end
            return before + _encode(lines, data_at[0], masked) + end
        for key, holder, field in deltas:
            p = self._pending.setdefault(key, _Pending())
            p.event = (lines, obj, (holder, field))
            holder[field] = self._take(p, holder[field])
        return _encode(lines, data_at[0], obj) + end

    # -- masking -----------------------------------------------------------------------
    def _scan(self, text: str) -> list[Finding] | None:
        try:
            return self._detector.scan(text)
        except Exception as exc:
            self.error = f"scan failed ({type(exc).__name__})"
            return None

    def _take(self, p: _Pending, piece: str) -> str:
        """Add ``piece`` to the pending text; return what may be sent now, masked."""
        p.text += piece
        text = p.ctx + p.text
        base = len(p.ctx)
        cut = len(text) - self._hold
        if cut <= base:
            return ""
        found = self._scan(text)
        if found is None:
            p.ctx, p.text = "", ""
            return UNSCANNED
        for f in found:
            if f.start < cut < f.end:
                cut = min(cut, f.start)
        if cut <= base:
            return ""
        sent = self._masked(text, base, cut, [f for f in found if f.end <= cut])
        p.ctx = text[:cut][-self._hold:]
        p.text = text[cut:]
        return sent

    def _masked(self, text: str, base: int, cut: int, found: list[Finding]) -> str:
        out, last = [], base
        for f in found:
            if f.end <= base:
                continue
            start = max(f.start, base)
            out.append(text[last:start])
            out.append(f"<{f.entity}>")
            self.counts[f.entity] += 1
            last = f.end
        out.append(text[last:cut])
        return "".join(out)

    def _flush(self, key: tuple[Any, ...]) -> bytes:
        """The added event carrying ``key``'s held text (masked), or nothing."""
        p = self._pending.pop(key)
        if not p.text or p.event is None:
            return b""
        text = p.ctx + p.text
        found = self._scan(text)
        sent = UNSCANNED if found is None else self._masked(text, len(p.ctx), len(text), found)
        lines, obj, (holder, field) = p.event
        held = holder[field]
        holder[field] = sent
        at = next(i for i, line in enumerate(lines) if line.startswith(b"data:"))
        event = _encode(lines, at, _without_finish(obj)) + b"\n\n"
        holder[field] = held
        return event

    def _flush_all(self) -> bytes:
        return b"".join(self._flush(key) for key in list(self._pending)) if self._pending else b""

    def _mask_whole(self, obj: dict[str, Any]) -> Any:
        try:
            return mask_value(self._detector, obj, self.counts)
        except Exception as exc:
            self.error = f"scan failed ({type(exc).__name__})"
            return _blank(obj)


def _text_deltas(obj: dict[str, Any]) -> list[tuple[tuple[Any, ...], dict[str, Any], str]] | None:
    """The text deltas of an event (key, holder, field), or ``None`` when the event is not a
    pure text delta (it ends a choice, carries usage, a full text, or nothing to mask)."""
    if obj.get("type") == "response.output_text.delta" and isinstance(obj.get("delta"), str):
        return [(("r", obj.get("output_index"), obj.get("content_index")), obj, "delta")]
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or obj.get("usage"):
        return None
    out: list[tuple[tuple[Any, ...], dict[str, Any], str]] = []
    for choice in choices:
        if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
            return None
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if delta.get("tool_calls"):
                return None
            if isinstance(delta.get("content"), str):
                out.append((("c", choice.get("index")), delta, "content"))
        elif isinstance(choice.get("text"), str):
            out.append((("c", choice.get("index")), choice, "text"))
    return out or None


def _without_finish(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of a text event for held text: no role, logprobs or token ids repeated."""
    copy = json.loads(json.dumps(obj))
    for choice in copy.get("choices") or ():
        if isinstance(choice, dict):
            choice.pop("logprobs", None)
            choice.pop("token_ids", None)
            delta = choice.get("delta")
            if isinstance(delta, dict):
                delta.pop("role", None)
    copy.pop("usage", None)
    return copy  # type: ignore[no-any-return]


def _blank(value: Any) -> Any:
    """``value`` with every ``content``/``text`` string replaced by :data:`UNSCANNED`."""
    if isinstance(value, dict):
        return {k: (UNSCANNED if k in _TEXT_KEYS and isinstance(v, str) and v else _blank(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_blank(v) for v in value]
    return value


def _encode(lines: list[bytes], at: int, obj: Any) -> bytes:
    out = list(lines)
    out[at] = b"data: " + json.dumps(obj, ensure_ascii=False).encode("utf-8")
    return b"\n".join(out)


class ResponseMasker:
    """One request's response masking (``pii.responses: mask``) and its record.

    Args:
        pii: the policy's ``pii`` section.
    """

    def __init__(self, pii: PiiPolicy) -> None:
        self._pii = pii
        self._stream: StreamMask | None = None
        self._counts: Counter[str] = Counter()
        self._error: str | None = None

    def stream(self) -> StreamMask:
        """The masker of this response's SSE stream."""
        self._stream = StreamMask(self._pii, self._pii.section.response_hold_chars)
        return self._stream

    async def body(self, body: bytes) -> bytes:
        """A whole (non-streamed) answer, masked; over ``inline_max_chars`` bytes the scan runs
        in a worker thread. A detector failure blanks the generated text (fail closed)."""
        detector = self._pii.load()
        try:
            if len(body) <= self._pii.section.inline_max_chars:
                return mask_json_body(detector, body, self._counts)
            return await asyncio.to_thread(mask_json_body, detector, body, self._counts)
        except Exception as exc:
            self._error = f"scan failed ({type(exc).__name__})"
            try:
                return json.dumps(_blank(json.loads(body)), ensure_ascii=False).encode("utf-8")
            except ValueError:
                return UNSCANNED.encode()

    def finish(self, record: RequestRecord) -> None:
        """Add ``response_entities`` (masked findings per type), ``response_action: mask`` and
        any ``response_error`` to the record's ``pii`` verdict; never the text."""
        counts = Counter(self._counts)
        error = self._error
        if self._stream is not None:
            counts.update(self._stream.counts)
            error = error or self._stream.error
        verdict = dict(record.pii or {})
        verdict["response_entities"] = dict(counts)
        verdict["response_action"] = "mask"
        if error is not None:
            verdict["response_error"] = error
        record.detected(verdict)
