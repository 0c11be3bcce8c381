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
from collections.abc import Sequence
from typing import Any

from gateway.relay.records import RequestRecord
from policy import PiiPolicy
from policy.pii.engine import Detector, Finding, iter_strings, mask

__all__ = ["UNSCANNED", "ResponseMasker", "StreamMask", "mask_json_body", "mask_numbered",
           "mask_value", "restore_value"]

#: What replaces text the detector failed on (fail closed).
UNSCANNED = "<UNSCANNED>"

_EVENT_END = re.compile(rb"\r?\n\r?\n")
_PLACEHOLDER = re.compile(r"<[A-Z][A-Z0-9_]*_[0-9]+>")
_TEXT_KEYS = frozenset({"content", "text"})


def _spans(value: Any, path: str = "") -> list[tuple[str, str]]:
    """The ``(path, text)`` of every string under a ``content``/``text`` key."""
    return [(p, t) for p, t in iter_strings(value, path, keys=False)
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
    # Keys of an answer are the API's own names: not scanned, so paths match _spans's.
    findings = [f for f in detector.scan(value, keys=False) if f.path in keep]
    counts.update(f.entity for f in findings)
    return mask(value, findings)


def mask_numbered(value: Any, findings: Sequence[Finding], reversible: frozenset[str],
                  restore: dict[str, str]) -> Any:
    """``value`` with findings masked: those of ``reversible`` types by numbered placeholders
    (``<IBAN_CODE_1>``; one value, one placeholder) recorded in ``restore``, others by
    ``<ENTITY>``.

    Args:
        value: a JSON value the findings were made on (not changed).
        findings: findings to mask.
        reversible: entity types masked reversibly.
        restore: gets placeholder -> original value (the request's own; never logged).

    Raises:
        ValueError: a finding is in an object key (:func:`policy.pii.engine.mask`).
    """
    numbers: dict[tuple[str, str], str] = {(k.rsplit("_", 1)[0][1:], v): k
                                           for k, v in restore.items()}

    def label(entity: str, original: str) -> str:
        if entity not in reversible:
            return f"<{entity}>"
        known = numbers.get((entity, original))
        if known is None:
            n = 1 + sum(1 for e, _ in numbers if e == entity)
            known = numbers[(entity, original)] = f"<{entity}_{n}>"
            restore[known] = original
        return known

    return mask(value, findings, label=label)


def restore_value(value: Any, restore: dict[str, str]) -> tuple[Any, int]:
    """``value`` with the placeholders of ``restore`` in its ``content``/``text`` strings
    mapped back, and the number mapped."""
    count = 0

    def original(m: re.Match[str]) -> str:
        nonlocal count
        found = restore.get(m.group())
        if found is None:
            return m.group()
        count += 1
        return found

    def walk(v: Any, key: str | None) -> Any:
        if isinstance(v, str):
            return _PLACEHOLDER.sub(original, v) if key in _TEXT_KEYS and "<" in v else v
        if isinstance(v, dict):
            return {k: walk(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, key) for x in v]
        return v

    return walk(value, None), count


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

    __slots__ = ("ctx", "event", "rtext", "text")

    def __init__(self) -> None:
        self.ctx = ""  # the last ``hold`` characters sent (scanned as left context only)
        self.text = ""  # received, not yet scanned/sent
        self.rtext = ""  # masked, held as it may be the start of a placeholder
        self.event: tuple[list[bytes], Any, tuple[Any, ...]] | None = None


class StreamMask:
    """Masks the generated text of an SSE stream as it passes (see the module docstring).

    ``feed`` takes the bytes the relay would send (after its usage scanner) and returns those
    to send instead; ``finish`` returns what is still held at the end of the stream.

    Args:
        pii: the policy's ``pii`` section (its detector is built already); ``None``: no
            masking, only ``restore``.
        hold: characters held back per choice (``pii.response_hold_chars``): the longest
            identifier found when split across events.
        restore: placeholder -> the request's value (reversible masking), mapped back in the
            text after masking (a placeholder split across events is held until whole).
    """

    def __init__(self, pii: PiiPolicy | None, hold: int,
                 restore: dict[str, str] | None = None) -> None:
        self._detector = pii.load() if pii is not None else None
        self._hold = hold
        self._restore = restore or {}
        self._longest = max((len(k) for k in self._restore), default=0)
        self.restored = 0
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
        if self._detector is None:
            return []
        try:
            return self._detector.scan(text)
        except Exception as exc:
            self.error = f"scan failed ({type(exc).__name__})"
            return None

    def _take(self, p: _Pending, piece: str) -> str:
        """Add ``piece`` to the pending text; return what may be sent now, masked, with
        placeholders mapped back."""
        if self._detector is None:
            return self._unplace(p, piece, False)
        return self._unplace(p, self._mask_some(p, piece), False)

    def _unplace(self, p: _Pending, text: str, final: bool) -> str:
        """Placeholders in ``text`` mapped back; a possible placeholder start is held."""
        if not self._restore:
            return text
        text = p.rtext + text
        p.rtext = ""
        at = text.rfind("<")
        if not final and at >= 0 and ">" not in text[at:] and len(text) - at < self._longest:
            text, p.rtext = text[:at], text[at:]
        return _PLACEHOLDER.sub(self._original, text)

    def _original(self, m: re.Match[str]) -> str:
        value = self._restore.get(m.group())
        if value is None:
            return m.group()
        self.restored += 1
        return value

    def _mask_some(self, p: _Pending, piece: str) -> str:
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
        if not (p.text or p.rtext) or p.event is None:
            return b""
        text = p.ctx + p.text
        found = self._scan(text)
        sent = UNSCANNED if found is None else self._masked(text, len(p.ctx), len(text), found)
        sent = self._unplace(p, sent, True)
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
            if self._detector is not None:
                obj = mask_value(self._detector, obj, self.counts)
        except Exception as exc:
            self.error = f"scan failed ({type(exc).__name__})"
            return _blank(obj)
        if self._restore:
            obj, n = restore_value(obj, self._restore)
            self.restored += n
        return obj


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
        masking: whether the answer's own findings are masked (``responses: mask``).
        restore: placeholder -> value of this request's reversible masking, mapped back in
            the answer (this object only: never logged, gone with the request).
    """

    def __init__(self, pii: PiiPolicy, masking: bool = True,
                 restore: dict[str, str] | None = None) -> None:
        self._pii = pii
        self._masking = masking
        self._restore = restore or {}
        self._stream: StreamMask | None = None
        self._counts: Counter[str] = Counter()
        self._error: str | None = None
        self._restored = 0

    def stream(self) -> StreamMask:
        """The masker of this response's SSE stream."""
        self._stream = StreamMask(self._pii if self._masking else None,
                                  self._pii.section.response_hold_chars, self._restore)
        return self._stream

    async def body(self, body: bytes) -> bytes:
        """A whole (non-streamed) answer, masked; over ``inline_max_chars`` bytes the scan runs
        in a worker thread. A detector failure blanks the generated text (fail closed)."""
        detector = self._pii.load()
        try:
            if self._masking and len(body) <= self._pii.section.inline_max_chars:
                body = mask_json_body(detector, body, self._counts)
            elif self._masking:
                body = await asyncio.to_thread(mask_json_body, detector, body, self._counts)
            if self._restore:
                body = self._restored_body(body)
            return body
        except Exception as exc:
            self._error = f"scan failed ({type(exc).__name__})"
            try:
                return json.dumps(_blank(json.loads(body)), ensure_ascii=False).encode("utf-8")
            except ValueError:
                return UNSCANNED.encode()

    def _restored_body(self, body: bytes) -> bytes:
        try:
            value = json.loads(body)
        except ValueError:
            return body
        value, n = restore_value(value, self._restore)
        self._restored += n
        return json.dumps(value, ensure_ascii=False).encode("utf-8") if n else body

    def finish(self, record: RequestRecord) -> None:
        """Add ``response_entities`` (masked findings per type), ``response_action: mask`` and
        any ``response_error`` to the record's ``pii`` verdict; never the text."""
        counts = Counter(self._counts)
        error = self._error
        if self._stream is not None:
            counts.update(self._stream.counts)
            error = error or self._stream.error
        restored = self._restored + (self._stream.restored if self._stream is not None else 0)
        self._restore.clear()  # the request's values: not kept after it
        verdict = dict(record.pii or {})
        if self._masking:
            verdict["response_entities"] = dict(counts)
            verdict["response_action"] = "mask"
        if restored:
            verdict["restored"] = restored
        if error is not None:
            verdict["response_error"] = error
        record.detected(verdict)
