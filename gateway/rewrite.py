"""Request body inspection and the minimal rewrite sent upstream.

The body is forwarded unchanged except for two splices: the value of the top-level ``model`` key
(replaced by the replica's ``served_model_name``) and, for streams, ``stream_options`` (forced to
``include_usage: true`` so every stream is accounted). Everything else, including key order,
whitespace, number spelling and unknown fields (``tools``, ``response_format``, ``guided_*``,
vLLM extras), is copied byte for byte: the top level is walked with the standard library's JSON
scanner, which reports where each value starts and ends.

JSON grammar: RFC 8259. A duplicated top-level ``model``, ``stream`` or ``stream_options`` key is
refused, because the gateway and the backend might otherwise read different values.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from json.decoder import JSONDecodeError, scanstring  # type: ignore[attr-defined]
from typing import Any

from gateway.errors import InvalidRequest

__all__ = ["ParsedBody", "parse_body"]

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_INTERPRETED = frozenset({"model", "stream", "stream_options"})


@dataclass(slots=True)
class ParsedBody:
    """A validated request body.

    Attributes:
        text: The body decoded as UTF-8.
        model: The ``model`` the client asked for.
        stream: Whether ``"stream": true`` was sent.
        client_wants_usage: Whether the client set ``stream_options.include_usage``.
        values: Top-level values by key (parsed; read-only use).
    """

    text: str
    model: str
    stream: bool
    client_wants_usage: bool
    values: dict[str, Any]
    spans: dict[str, tuple[int, int]] = field(repr=False)
    open_brace: int = field(repr=False, default=0)

    def upstream_body(self, served_model: str, force_usage: bool) -> bytes:
        """The bytes to send upstream.

        Args:
            served_model: Value for ``model``.
            force_usage: Set ``stream_options.include_usage`` to true (streams only).

        Returns:
            UTF-8 body, identical to the client's except for the spliced values.
        """
        edits: list[tuple[int, int, str]] = []
        start, end = self.spans["model"]
        edits.append((start, end, json.dumps(served_model, ensure_ascii=False)))
        if force_usage and self.stream and not self.client_wants_usage:
            current = self.values.get("stream_options")
            if "stream_options" in self.spans:
                opts = dict(current) if isinstance(current, dict) else {}
                opts["include_usage"] = True
                s, e = self.spans["stream_options"]
                edits.append((s, e, json.dumps(opts, separators=(",", ":"), ensure_ascii=False)))
            else:
                pos = self.open_brace + 1
                edits.append((pos, pos, '"stream_options":{"include_usage":true},'))
        text = self.text
        for s, e, new in sorted(edits, reverse=True):
            text = text[:s] + new + text[e:]
        return text.encode("utf-8")


def _fail_json(exc: JSONDecodeError) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid JSON in request body: {exc.msg}: line {exc.lineno} column {exc.colno} "
        f"(char {exc.pos})",
        code="invalid_json",
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
            value, end = _DECODER.raw_decode(text, idx)
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


def parse_body(raw: bytes) -> ParsedBody:
    """Validate a request body and locate the values the gateway rewrites.

    Args:
        raw: The complete request body.

    Returns:
        The parsed body.

    Raises:
        InvalidRequest: Not UTF-8, not JSON (message gives line, column and character offset),
            not an object, duplicate interpreted key, no string ``model``, a ``stream`` or
            ``stream_options.include_usage`` that is neither boolean nor null, or a
            ``stream_options`` that is neither object nor null.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(
            f"Request body is not valid UTF-8 (byte {exc.start})", code="invalid_json"
        ) from exc
    try:
        brace, values, spans = _scan_object(text)
    except JSONDecodeError as exc:
        raise _fail_json(exc) from exc
    except RecursionError as exc:
        raise InvalidRequest("Request body nests too deeply", code="invalid_json") from exc
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
        text=text,
        model=model,
        stream=stream is True,
        client_wants_usage=wants_usage,
        values=values,
        spans=spans,
        open_brace=brace,
    )
