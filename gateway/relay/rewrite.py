"""The relay's rewrite of the bodies, both ways: the request body inspected and minimally
rewritten upstream (``model``, a forced ``stream_options.include_usage``), and the response's
Server-Sent Events scanned for the token usage that forcing yields, the usage-only events
removed again for a client that did not ask for them (:class:`SSEUsageScanner`).

The request
-----------


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

The response (:class:`SSEUsageScanner`)
---------------------------------------

Incremental Server-Sent Events scanning for token usage.

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
import math
import re
from dataclasses import dataclass, field
from json.decoder import JSONDecodeError, scanstring  # type: ignore[attr-defined]
from typing import Any

from gateway.errors import InvalidRequest

__all__ = [
    "MAX_DEPTH",
    "MAX_EVENT_BYTES",
    "SAMPLE_BYTES",
    "ParsedBody",
    "SSEUsageScanner",
    "Usage",
    "parse_body",
    "usage_from_body",
    "usage_from_body_end",
    "usage_from_mapping",
]

_WS = re.compile(r"[ \t\n\r]*")
_COLON = re.compile(r"[ \t\n\r]*:[ \t\n\r]*")  # between a key and its value
_COMMA = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")  # between a value and the next key
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_COLON_BYTES = re.compile(rb"[ \t\n\r]*:[ \t\n\r]*")
# A JSON string of lower-case letters and underscores with at least one of them escaped
# (``\u0060``-``\u007f``, ``\u005f``): how an interpreted key could hide from a literal count.
_NAME_ESCAPE = r"\\u00(?:[67][0-9a-fA-F]|5[fF])"
_ESCAPED_NAME = re.compile(rf'"(?:[a-z_]|{_NAME_ESCAPE})*{_NAME_ESCAPE}(?:[a-z_]|{_NAME_ESCAPE})*"')

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
# the digit limit, which _value_error maps.
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
    _spans: dict[str, tuple[int, int]] | None = field(repr=False)
    open_brace: int = field(repr=False, default=0)
    priority: int | None = None
    _shed: bool = field(repr=False, default=False)
    _model_at: int = field(repr=False, default=-1)

    @property
    def spans(self) -> dict[str, tuple[int, int]]:
        """Byte offsets ``(start, end)`` in ``raw`` of the values of the top-level keys that
        may be spliced. Located on first use: a body read whole by the C decoder
        (:func:`parse_body`'s usual path) is walked key by key only when a splice needs them."""
        if self._spans is None:
            text = self.raw.decode("utf-8")
            self._spans = _byte_spans(text, self.raw, _scan_object(text)[2])
        return self._spans

    @property
    def values(self) -> dict[str, Any]:
        """Top-level values by key (parsed; read-only use). After :meth:`shed`, the first
        read parses them again from ``raw`` (already validated: the same values)."""
        if self._shed:
            # Validated when received: the C decoder reads the same values the walk would.
            self._values = _DECODER.raw_decode(self.raw.decode("utf-8"), self.open_brace)[0]
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
        literal = _literal(served_model)
        raw = self.raw
        # The common case: the client already sent the served name, spelled as it is written
        # here (known without locating the spans when the body was read whole).
        at = self._model_at
        if at < 0 or self.model != served_model or not raw.startswith(literal, at):
            start, end = self.spans["model"]
            if raw[start:end] != literal:
                edits.append((start, end, literal))
        if force_usage and self.stream and not self.client_wants_usage:
            current = self._values.get("stream_options")  # kept by shed()
            if "stream_options" in self._values:
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
            if "priority" in self._values:
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
    """Walk the top-level object; return (index of ``{``, values, value spans).

    The delimiters with the whitespace around them (``: ``, ``, ``) are each one regex match;
    the error positions are those of the standard library's object scanner.
    """
    skip = _WS.match
    idx = skip(text, 0).end()  # type: ignore[union-attr]
    if text[idx : idx + 1] != "{":
        raise JSONDecodeError("Expecting a JSON object", text, idx)
    brace = idx
    values: dict[str, Any] = {}
    spans: dict[str, tuple[int, int]] = {}
    idx = skip(text, idx + 1).end()  # type: ignore[union-attr]
    if text[idx : idx + 1] == "}":
        idx += 1
    else:
        decode, colon, comma = _DECODER.raw_decode, _COLON.match, _COMMA.match
        while True:
            if text[idx : idx + 1] != '"':
                msg = "Expecting property name enclosed in double quotes"
                raise JSONDecodeError(msg, text, idx)
            key, idx = scanstring(text, idx + 1)
            delimiter = colon(text, idx)
            if delimiter is None:
                idx = skip(text, idx).end()  # type: ignore[union-attr]
                raise JSONDecodeError("Expecting ':' delimiter", text, idx)
            idx = delimiter.end()
            try:
                value, end = decode(text, idx)
            except JSONDecodeError:
                raise
            except (ValueError, RecursionError) as exc:
                raise _value_error(exc, text, idx) from exc
            if key in spans and key in _INTERPRETED:
                raise InvalidRequest(f"duplicate key {key!r} in request body", param=key)
            values[key] = value
            spans[key] = (idx, end)
            delimiter = comma(text, end)
            if delimiter is not None:
                idx = delimiter.end()
                continue
            idx = skip(text, end).end()  # type: ignore[union-attr]
            if text[idx : idx + 1] == "}":
                idx += 1
                break
            raise JSONDecodeError("Expecting ',' delimiter", text, idx)
    if idx != len(text):
        idx = skip(text, idx).end()  # type: ignore[union-attr]
        if idx != len(text):
            raise JSONDecodeError("Extra data", text, idx)
    return brace, values, spans


def _value_error(exc: ValueError | RecursionError, text: str, idx: int) -> JSONDecodeError:
    """The ``JSONDecodeError`` for what decoding the value at ``idx`` raised besides one."""
    if isinstance(exc, _OutOfRange):
        return JSONDecodeError(f"{exc} (in the value starting here)", text, idx)
    if isinstance(exc, ValueError):  # int(): more digits than the interpreter converts
        msg = "integer with too many digits (in the value starting here)"
        return JSONDecodeError(msg, text, idx)
    return JSONDecodeError("nesting too deep (in the value starting here)", text, idx)


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
    read = _read_whole(text)
    spans: dict[str, tuple[int, int]] | None = None
    if read is not None:
        brace, values = read
    else:  # the walk: every refusal with its position, and the spans
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
    model_at = -1
    if spans is None:  # read whole: "model" is spelled once, literally, as the top-level key
        key = raw.find(b'"model"')
        colon = _COLON_BYTES.match(raw, key + 7)
        assert colon is not None  # (a valid object: the key's colon follows it)
        model_at = colon.end()
    return ParsedBody(
        raw=raw,
        model=model,
        stream=stream is True,
        client_wants_usage=wants_usage,
        _values=values,
        _spans=None if spans is None else _byte_spans(text, raw, spans),
        open_brace=brace,  # only whitespace (ASCII) before it: the byte offset too
        _model_at=model_at,
    )


def _read_whole(text: str) -> tuple[int, dict[str, Any]] | None:
    """The usual body read in one call of the C decoder: ``(index of {, values)``, or
    ``None`` when the key-by-key walk (:func:`_scan_object`) must read it.

    The walk is left for what only it tells apart: any invalid JSON (its error names the
    position), more brackets than :data:`MAX_DEPTH` (the depth check), a surrogate escape, and
    any body in which an interpreted key could appear twice at the top level (the decoder
    keeps the last one silently): ``"model"``, ``"stream"`` or ``"stream_options"`` spelled
    literally more than once anywhere, or any string made only of lower-case letters,
    underscores and escapes of them (an interpreted key spelled with escapes). What passes
    reads exactly as the walk would read it (the same decoder on each value)."""
    idx = _WS.match(text).end()  # type: ignore[union-attr]
    if (text[idx : idx + 1] != "{" or text.count('"model"') > 1 or text.count('"stream"') > 1
            or text.count('"stream_options"') > 1
            or text.count("[") + text.count("{") > MAX_DEPTH
            or ("\\" in text and (_ESCAPED_NAME.search(text) is not None
                                   or _SURROGATE_ESCAPE.search(text) is not None))):
        return None
    try:
        values, end = _DECODER.raw_decode(text, idx)
    except (ValueError, RecursionError):
        return None
    if end != len(text) and _WS.match(text, end).end() != len(text):  # type: ignore[union-attr]
        return None
    return idx, values


def _literal(name: str) -> bytes:
    """``name`` as a JSON string in UTF-8 (made once per name)."""
    literal = _LITERALS.get(name)
    if literal is None:
        literal = json.dumps(name, ensure_ascii=False).encode("utf-8")
        if len(_LITERALS) < 1024:  # served names: a handful per configuration
            _LITERALS[name] = literal
    return literal


_LITERALS: dict[str, bytes] = {}


# --- The response side: scanning Server-Sent Events for token usage. ----------------------

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
_DATA_SP = b"data: "
_LINE_ENDS = (10, 13)  # LF, CR
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
        # The usual body, an object in UTF-8, decoded here as json.loads would decode it
        # (its encoding detection says UTF-8 when the first two bytes are not NUL), without
        # that detection's Python call.
        text = (body.decode("utf-8", "surrogatepass")
                if body[:1] == b"{" and body[1:2] != b"\x00" else body)
        return usage_from_mapping(json.loads(text))
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
    """Whether ``region[:end]`` (starting at an event start) holds the ``data: [DONE]`` line
    (what ``_DONE_LINE.search(region, 0, end)`` finds).

    Each ``[DONE]`` is looked at from where it is, backwards: the regex's leading ``(?:^|
    [\r\n])`` gives its engine no literal to skip to, so it tried every byte of the region
    (27 us for a short stream's whole answer, 1.4 ms for 60 KB)."""
    pos = region.find(_DONE, 0, end)
    while pos >= 0:
        if region.endswith(_DATA, 0, pos):
            start = pos - 5
        elif region.endswith(_DATA_SP, 0, pos):
            start = pos - 6
        else:
            start = -1
        if start == 0 or (start > 0 and region[start - 1] in _LINE_ENDS):
            return True
        pos = region.find(_DONE, pos + 1, end)
    return False


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
