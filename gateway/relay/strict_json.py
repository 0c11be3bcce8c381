"""Strict JSON for the documents the gateway reads whole: batch input lines, batch create
bodies, MCP messages.

The relay reads request bodies with its own locating parser (:func:`gateway.relay.rewrite.
parse_body`); the other readers used ``json.loads``, which accepts what RFC 8259 leaves
undefined or forbids and lets some inputs escape as exceptions that became 500s: a lone
surrogate escape (``"\\ud800"``, which UTF-8 cannot store: it failed later, in the store or
the audit writer), nesting deep enough to exhaust the stack (``RecursionError``), ``NaN`` and
``Infinity``, numbers out of range, and repeated keys (the last one silently won).
:func:`loads_strict` refuses each with one :class:`StrictJsonError` whose message says what
and where:

* invalid UTF-8 and a byte order mark (RFC 8259 §8.1);
* a repeated key in any object (RFC 8259 §4 leaves its meaning open: two readers may pick
  different values);
* ``NaN``, ``Infinity``, ``-Infinity`` and floats that overflow (RFC 8259 §6);
* nesting deeper than :data:`~gateway.relay.rewrite.MAX_DEPTH` (RFC 8259 §9 allows a limit);
* a string or key with an unpaired UTF-16 surrogate escape (RFC 8259 §8.2).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from gateway.relay.rewrite import MAX_DEPTH

__all__ = [
    "StrictJsonError", "check_tree", "decode_utf8", "loads_strict", "refuse_constant",
    "refuse_duplicates", "strict_float", "tree_check_needed",
]


class StrictJsonError(ValueError):
    """The document is not JSON the gateway accepts; the message says what and where
    (``line L column C`` from the decoder, or the key path of the value).

    Attributes:
        duplicate_key: The refusal is a key repeated in one object (callers with their own
            code for it, such as MCP's ``duplicate_key``, tell it apart).
    """

    def __init__(self, message: str, *, duplicate_key: bool = False) -> None:
        super().__init__(message)
        self.duplicate_key = duplicate_key


def refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` of :mod:`json` that refuses a key repeated in one object.

    Raises:
        StrictJsonError: With ``duplicate_key`` set, naming the key (at most 64 characters).
    """
    out = dict(pairs)  # built in C; a repeated key leaves fewer entries than pairs
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise StrictJsonError(f"the key {key[:64]!r} appears twice in one object",
                                      duplicate_key=True)
            seen.add(key)
    return out


def strict_float(literal: str) -> float:
    """``parse_float`` hook of :mod:`json` that refuses a number overflowing to infinity
    (``1e999``; RFC 8259 §6 lets a parser limit the range).

    Raises:
        StrictJsonError: The number is out of range, naming it.
    """
    value = float(literal)
    if math.isinf(value):
        raise StrictJsonError(f"the number {literal[:40]} is out of range")
    return value


def refuse_constant(literal: str) -> Any:
    """``parse_constant`` hook of :mod:`json` that refuses ``NaN``, ``Infinity`` and
    ``-Infinity`` (Python's extension, not JSON: RFC 8259 §6).

    Raises:
        StrictJsonError: Always, naming the literal.
    """
    raise StrictJsonError(f"{literal} is not JSON (RFC 8259)")


_DECODER = json.JSONDecoder(object_pairs_hook=refuse_duplicates, parse_float=strict_float,
                            parse_constant=refuse_constant)


def _path(parts: list[str | int]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p[:64]}" for p in parts) or "."


def check_tree(value: Any) -> None:
    """Refuse nesting deeper than :data:`~gateway.relay.rewrite.MAX_DEPTH` and strings or keys
    with an unpaired surrogate in a parsed value (iteratively: a value as deep as the decoder
    allows must not exhaust the stack here).

    Args:
        value: A value parsed by :mod:`json`.

    Raises:
        StrictJsonError: The first problem, with the key path of the value.
    """
    stack: list[tuple[Any, int, list[str | int]]] = [(value, 1, [])]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise StrictJsonError(
                    f"the string at {_path(path)} holds an unpaired UTF-16 surrogate "
                    "escape (RFC 8259 §8.2)") from exc
            continue
        if not isinstance(item, dict | list):
            continue
        if depth > MAX_DEPTH:
            raise StrictJsonError(f"nesting deeper than {MAX_DEPTH} levels at {_path(path)}")
        if isinstance(item, dict):
            for key, sub in item.items():
                try:
                    key.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise StrictJsonError(
                        f"a key in the object at {_path(path)} holds an unpaired UTF-16 "
                        "surrogate escape (RFC 8259 §8.2)") from exc
                stack.append((sub, depth + 1, [*path, key]))
        else:
            stack.extend((sub, depth + 1, [*path, i]) for i, sub in enumerate(item))


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""A ``\\uD800``..``\\uDFFF`` escape (any case)."""
_SURROGATE_CHAR = re.compile(r"[\ud800-\udfff]")
"""A surrogate character (never in text from :func:`decode_utf8`, which refuses them)."""


def tree_check_needed(text: str) -> bool:
    """Whether :func:`check_tree` could refuse the value :mod:`json` parses from ``text``.

    Scans in C instead of a walk in Python over every value: a container nested ``d``
    levels deep has ``d`` opening brackets before it, so a text with at most
    :data:`~gateway.relay.rewrite.MAX_DEPTH` of them (inside strings too) nests no deeper;
    and a text without a surrogate escape (:data:`_SURROGATE_ESCAPE`) or character parses
    to no string or key that holds one. ``True`` may be a false alarm (brackets inside
    strings, an escaped backslash before ``ud800``, a valid surrogate pair): the walk then
    decides.
    """
    return (text.count("[") + text.count("{") > MAX_DEPTH
            or _SURROGATE_ESCAPE.search(text) is not None
            or (not text.isascii() and _SURROGATE_CHAR.search(text) is not None))


def decode_utf8(raw: bytes | bytearray) -> str:
    """The text of a JSON document: UTF-8 only (RFC 8259 §8.1; :mod:`json` would also take
    UTF-16 and UTF-32), without a byte order mark.

    Raises:
        StrictJsonError: Not UTF-8 (naming the byte), or a byte order mark.
    """
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StrictJsonError(f"not valid UTF-8 (byte {exc.start})") from exc
    if text.startswith("\ufeff"):
        raise StrictJsonError("a byte order mark (RFC 8259 §8.1) at line 1 column 1")
    return text


def loads_strict(raw: bytes | str) -> Any:
    """Parse one JSON document strictly (see the module docstring for what is refused).

    Args:
        raw: The document, UTF-8 bytes (or already decoded text).

    Returns:
        The parsed value (dicts, lists, str, int, float, bool, None).

    Raises:
        StrictJsonError: The first problem found, with its position (``line L column C (char
            N)``, counted in the document) or the key path of the value (``.messages[0]``).
    """
    text = decode_utf8(raw) if isinstance(raw, bytes | bytearray) else raw
    if text.startswith("\ufeff"):
        raise StrictJsonError("a byte order mark (RFC 8259 §8.1) at line 1 column 1")
    try:
        value = _DECODER.decode(text)
    except StrictJsonError:
        raise
    except json.JSONDecodeError as exc:
        raise StrictJsonError(f"{exc.msg}: line {exc.lineno} column {exc.colno} "
                              f"(char {exc.pos})") from exc
    except RecursionError as exc:
        raise StrictJsonError(f"nesting deeper than {MAX_DEPTH} levels") from exc
    except ValueError as exc:  # int(): more digits than the interpreter converts
        raise StrictJsonError(f"a number out of range ({str(exc)[:80]})") from exc
    if tree_check_needed(text):  # else nothing for the walk to find
        check_tree(value)
    return value
