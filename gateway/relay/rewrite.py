"""Request body inspection and the minimal rewrite sent upstream.

The body is forwarded unchanged except for two splices: the value of the top-level ``model`` key
(replaced by the replica's ``served_model_name``) and, for streams, ``stream_options`` (forced to
``include_usage: true`` so every stream is accounted). A third, ``priority``, only for models
that flow control is configured to schedule with vLLM's own priorities
(``flow_control.vllm_priority_models``). Everything else, including key order,
whitespace, number spelling and unknown fields (``tools``, ``response_format``, ``guided_*``,
vLLM extras), is copied byte for byte: the top level is walked with the standard library's JSON
scanner, which reports where each value starts and ends.

JSON grammar: RFC 8259, strictly; anything else is a 400 ``invalid_json`` naming the position
(line, column, character offset), never a 500:

* ``NaN``, ``Infinity`` and ``-Infinity`` (Python's extension) are refused;
* a number whose value is out of range is refused: an integer of more than 4,300 digits
  (Python's conversion limit, which the Python-based backends share) or a float that overflows
  to infinity (``1e999``); RFC 8259 §6 lets implementations limit the range;
* a string with an unpaired UTF-16 surrogate escape (``"\ud800"``) is refused: RFC 8259 §8.2
  says the behaviour of receivers is unpredictable, and UTF-8 cannot carry it;
* a byte order mark is refused (RFC 8259 §8.1: senders must not add one), as is nesting deeper
  than :data:`MAX_DEPTH` (128) levels (RFC 8259 §9 lets parsers limit depth).

Duplicate keys (RFC 8259 §4 leaves their meaning open): a duplicated top-level ``model``,
``stream`` or ``stream_options`` key is refused, because the gateway and the backend might
otherwise read different values. Other duplicates are relayed untouched: the gateway does not
interpret them, and Python-based backends (vLLM) take the last one, as Python's parser does.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from json.decoder import JSONDecodeError, scanstring  # type: ignore[attr-defined]
from typing import Any

from gateway.errors import InvalidRequest

__all__ = ["MAX_DEPTH", "ParsedBody", "parse_body"]

_WS = re.compile(r"[ \t\n\r]*")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

_CONTAINERS = frozenset({dict, list})  # what the JSON decoder makes for objects and arrays

MAX_DEPTH = 128
"""Deepest nesting of arrays and objects accepted in a request body (RFC 8259 §9 allows a
limit). Far above what chat, tools or JSON-schema bodies use, far below the interpreter's
recursion limit, so no later reader of the parsed body (quotas, audit) can exhaust the stack."""


class _OutOfRange(ValueError):
    """A number or constant that RFC 8259 excludes or that cannot be represented."""


def _parse_float(literal: str) -> float:
    value = float(literal)
    if value in (math.inf, -math.inf):
        raise _OutOfRange(f"number {literal[:40]} is out of range")
    return value


def _parse_constant(literal: str) -> float:
    raise _OutOfRange(f"{literal} is not valid JSON (RFC 8259)")


# int stays the C fast path (token-id prompts are long int arrays); it raises ValueError beyond
# the digit limit, which _decode_value maps.
_DECODER = json.JSONDecoder(parse_float=_parse_float, parse_constant=_parse_constant)
_INTERPRETED = frozenset({"model", "stream", "stream_options"})


_SPLICED = ("model", "stream_options", "priority")
"""Top-level keys whose values :meth:`ParsedBody.upstream_body` may replace."""


@dataclass(slots=True)
class ParsedBody:
    """A validated request body, held once: the bytes as received and the parsed top-level
    values (the decoded text is not kept; a queued request holds its body about twice, the
    bytes and the values, see ``bench/queued_memory.py``).

    Attributes:
        raw: The body as received (sent as is when no splice changes a byte).
        model: The ``model`` the client asked for.
        stream: Whether ``"stream": true`` was sent.
        client_wants_usage: Whether the client set ``stream_options.include_usage``.
        values: Top-level values by key (a property: see :attr:`values`).
        spans: Byte offsets ``(start, end)`` in ``raw`` of the values of the top-level keys
            that may be spliced (``model``, and ``stream_options`` and ``priority`` when sent).
        open_brace: Byte offset of the top-level ``{``.
        priority: When set, the ``priority`` sent upstream (vLLM priority scheduling; set by
            flow control only for models configured for it), replacing the client's.
    """

    raw: bytes = field(repr=False)
    model: str
    stream: bool
    client_wants_usage: bool
    _values: dict[str, Any] = field(repr=False)
    spans: dict[str, tuple[int, int]] = field(repr=False)
    open_brace: int = field(repr=False, default=0)
    priority: int | None = None
    _shed: bool = field(repr=False, default=False)

    @property
    def values(self) -> dict[str, Any]:
        """Top-level values by key (parsed; read-only use). After :meth:`shed`, the first
        read parses them again from ``raw`` (already validated: the same values)."""
        if self._shed:
            self._values = _scan_object(self.raw.decode("utf-8"))[1]
            self._shed = False
        return self._values

    def shed(self) -> None:
        """Drop the parsed values but those the splices need, while the request waits in a
        queue: a queued request then holds its body once (``raw``), not twice. The values
        come back, parsed again, on the next read of :attr:`values`."""
        self._values = {k: self._values[k] for k in _SPLICED if k in self._values}
        self._shed = True

    def upstream_body(self, served_model: str, force_usage: bool) -> bytes:
        """The bytes to send upstream.

        Args:
            served_model: Value for ``model``.
            force_usage: Set ``stream_options.include_usage`` to true (streams only).

        Returns:
            UTF-8 body, identical to the client's except for the spliced values: ``raw``
            itself (not a copy) when nothing is spliced.

        Raises:
            InvalidRequest: ``stream_options`` nests too deep to be written back.
        """
        edits: list[tuple[int, int, bytes]] = []
        start, end = self.spans["model"]
        literal = json.dumps(served_model, ensure_ascii=False).encode("utf-8")
        raw = self.raw
        if raw[start:end] != literal:  # the common case: the client already sent it so
            edits.append((start, end, literal))
        if force_usage and self.stream and not self.client_wants_usage:
            current = self._values.get("stream_options")  # kept by shed()
            if "stream_options" in self.spans:
                opts = dict(current) if isinstance(current, dict) else {}
                opts["include_usage"] = True
                s, e = self.spans["stream_options"]
                try:
                    spliced = json.dumps(opts, separators=(",", ":"), ensure_ascii=False)
                except RecursionError as exc:  # parsed a few frames higher up the stack
                    raise InvalidRequest(
                        "Invalid JSON in request body: nesting too deep in 'stream_options'",
                        code="invalid_json",
                        param="stream_options",
                    ) from exc
                edits.append((s, e, spliced.encode("utf-8")))
            else:
                pos = self.open_brace + 1
                edits.append((pos, pos, b'"stream_options":{"include_usage":true},'))
        if self.priority is not None:
            if "priority" in self.spans:
                s, e = self.spans["priority"]
                edits.append((s, e, str(self.priority).encode()))
            else:
                pos = self.open_brace + 1
                edits.append((pos, pos, b'"priority":%d,' % self.priority))
        if not edits:
            return raw  # not a byte to change: no copy, no encoding
        # One copy of the body, built from views of the unchanged runs.
        view = memoryview(raw)
        parts: list[bytes | memoryview] = []
        at = 0
        for s, e, new in sorted(edits):
            parts += (view[at:s], new)
            at = e
        parts.append(view[at:])
        return b"".join(parts)


def _byte_spans(text: str, raw: bytes,
                spans: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """The spans of the spliced keys as byte offsets in ``raw`` (``spans`` are character
    offsets in ``text``, ``raw`` decoded; the same numbers when the body is ASCII)."""
    kept = {k: spans[k] for k in _SPLICED if k in spans}
    if len(text) == len(raw):
        return kept
    return {k: (len(text[:s].encode("utf-8")), len(text[:e].encode("utf-8")))
            for k, (s, e) in kept.items()}


def _fail_json(exc: JSONDecodeError) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid JSON in request body: {exc.msg}: line {exc.lineno} column {exc.colno} "
        f"(char {exc.pos})",
        code="invalid_json",
    )


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays/objects more than ``limit`` levels (iterative walk)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        if _CONTAINERS.isdisjoint(map(type, children)):  # C speed for long scalar arrays
            continue
        stack.extend((c, depth + 1) for c in children if type(c) in _CONTAINERS)
    return False


def _check_depth(text: str, values: dict[str, Any], spans: dict[str, tuple[int, int]]) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` (the top-level object is level 1).

    Counting brackets in C first keeps the common body free of any walk.

    Raises:
        JSONDecodeError: At the start of the top-level value that nests too deep.
    """
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return
    for key, value in values.items():
        if isinstance(value, (dict, list)) and _deeper_than(value, MAX_DEPTH - 1):
            raise JSONDecodeError(
                f"nesting deeper than {MAX_DEPTH} levels (in the value starting here)",
                text,
                spans[key][0],
            )


def _scan_object(text: str) -> tuple[int, dict[str, Any], dict[str, tuple[int, int]]]:
    """Walk the top-level object; return (index of ``{``, values, value spans)."""
    idx = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if text[idx : idx + 1] != "{":
        raise JSONDecodeError("Expecting a JSON object", text, idx)
    brace = idx
    values: dict[str, Any] = {}
    spans: dict[str, tuple[int, int]] = {}
    idx = _WS.match(text, idx + 1).end()  # type: ignore[union-attr]
    if text[idx : idx + 1] == "}":
        idx += 1
    else:
        while True:
            if text[idx : idx + 1] != '"':
                msg = "Expecting property name enclosed in double quotes"
                raise JSONDecodeError(msg, text, idx)
            key, idx = scanstring(text, idx + 1)
            idx = _WS.match(text, idx).end()  # type: ignore[union-attr]
            if text[idx : idx + 1] != ":":
                raise JSONDecodeError("Expecting ':' delimiter", text, idx)
            idx = _WS.match(text, idx + 1).end()  # type: ignore[union-attr]
            value, end = _decode_value(text, idx)
            if key in spans and key in _INTERPRETED:
                raise InvalidRequest(f"duplicate key {key!r} in request body", param=key)
            values[key] = value
            spans[key] = (idx, end)
            idx = _WS.match(text, end).end()  # type: ignore[union-attr]
            sep = text[idx : idx + 1]
            if sep == ",":
                idx = _WS.match(text, idx + 1).end()  # type: ignore[union-attr]
                continue
            if sep == "}":
                idx += 1
                break
            raise JSONDecodeError("Expecting ',' delimiter", text, idx)
    idx = _WS.match(text, idx).end()  # type: ignore[union-attr]
    if idx != len(text):
        raise JSONDecodeError("Extra data", text, idx)
    return brace, values, spans


def _decode_value(text: str, idx: int) -> tuple[Any, int]:
    """One JSON value at ``idx``; out-of-range numbers and constants as ``JSONDecodeError``."""
    try:
        return _DECODER.raw_decode(text, idx)
    except JSONDecodeError:
        raise
    except _OutOfRange as exc:
        raise JSONDecodeError(f"{exc} (in the value starting here)", text, idx) from exc
    except ValueError as exc:  # int(): more digits than the interpreter converts
        msg = "integer with too many digits (in the value starting here)"
        raise JSONDecodeError(msg, text, idx) from exc
    except RecursionError as exc:
        msg = "nesting too deep (in the value starting here)"
        raise JSONDecodeError(msg, text, idx) from exc


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string (key or value) in ``value`` holds an unpaired surrogate.

    Iterative: a value nested as deep as the parser allows must not exhaust the stack here.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _check_surrogates(text: str, values: dict[str, Any], spans: dict[str, tuple[int, int]]) -> None:
    """Refuse unpaired surrogate escapes (only looked for when the text has such an escape)."""
    if _SURROGATE_ESCAPE.search(text) is None:
        return
    for key, value in values.items():
        if _has_lone_surrogate(key) or _has_lone_surrogate(value):
            raise JSONDecodeError(
                "unpaired UTF-16 surrogate escape in a string (in the value starting here)",
                text,
                spans[key][0],
            )


def _decode_text(raw: bytes) -> str:
    """UTF-8 without a byte order mark (RFC 8259 §8.1)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"Request body is not valid UTF-8 (byte {exc.start})", code="invalid_json"
        ) from exc
    if text.startswith("\ufeff"):
        raise InvalidRequest(
            "Invalid JSON in request body: byte order mark (RFC 8259 §8.1): line 1 column 1 "
            "(char 0)",
            code="invalid_json",
        )
    return text


def parse_body(raw: bytes) -> ParsedBody:
    """Validate a request body and locate the values the gateway rewrites.

    Args:
        raw: The complete request body.

    Returns:
        The parsed body.

    Raises:
        InvalidRequest: Not UTF-8, a byte order mark, not RFC 8259 JSON (``invalid_json``;
            includes NaN/Infinity, out-of-range numbers and unpaired surrogate escapes; the
            message gives line, column and character offset), not an object, duplicate
            interpreted key, no string ``model``, a ``stream`` or
            ``stream_options.include_usage`` that is neither boolean nor null, or a
            ``stream_options`` that is neither object nor null.
    """
    text = _decode_text(raw)
    try:
        brace, values, spans = _scan_object(text)
        _check_depth(text, values, spans)
        _check_surrogates(text, values, spans)
    except JSONDecodeError as exc:
        raise _fail_json(exc) from exc
    model = values.get("model")
    if "model" not in values:
        raise InvalidRequest("You must provide a 'model' parameter.", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' must be a non-empty string.", param="model")
    stream = values.get("stream")
    if stream is not None and not isinstance(stream, bool):
        # vLLM's pydantic models coerce "true"/1 to a stream, but the gateway would then not
        # force include_usage on it: an unaccounted stream. OpenAI refuses them too.
        raise InvalidRequest("'stream' must be a boolean.", param="stream")
    opts = values.get("stream_options")
    if opts is not None and not isinstance(opts, dict):
        raise InvalidRequest("'stream_options' must be an object.", param="stream_options")
    usage_flag = opts.get("include_usage") if opts else None
    if usage_flag is not None and not isinstance(usage_flag, bool):
        raise InvalidRequest(
            "'stream_options.include_usage' must be a boolean.",
            param="stream_options.include_usage",
        )
    wants_usage = usage_flag is True
    return ParsedBody(
        raw=raw,
        model=model,
        stream=stream is True,
        client_wants_usage=wants_usage,
        _values=values,
        spans=_byte_spans(text, raw, spans),
        open_brace=brace,  # only whitespace (ASCII) before it: the byte offset too
    )
