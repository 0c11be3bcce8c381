"""``Mcp-Param-*`` headers of 2026-07-28 ``tools/call`` requests.

Source: MCP specification 2026-07-28, ``basic/transports`` "Custom Headers": a property of a
tool's ``inputSchema`` annotated ``"x-mcp-header": "<token>"`` (reachable from the root through
``properties`` only, of type string, integer or boolean, tokens unique ignoring case) is
mirrored by the client into ``Mcp-Param-<token>`` (``true``/``false``, ``str()`` of other
scalars, the ``=?base64?...?=`` sentinel for values that are not plain printable ASCII); the
server checks header and argument agree (absent together, else equal; a repeated header is a
mismatch), error ``-32020``. The rules here follow the official Python SDK's
``mcp.shared.inbound`` (``validate_mcp_param_headers``), which the tests run as the upstream.

The gateway checks the client's headers the same way, then never relays them: the headers
sent upstream are rebuilt from the arguments the gateway forwards (after masking), so no
header carries a value the argument checks did not see; headers no annotation declares are
dropped.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping
from typing import Any

from gateway.mcp.jsonrpc import HEADER_MISMATCH, McpRefusal

__all__ = ["PARAM_PREFIX", "Annotations", "check_param_headers", "check_params",
           "header_annotations", "mirror_params", "param_headers", "param_lines"]

PARAM_PREFIX = "mcp-param-"
"""Lower-case prefix of the parameter headers."""

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # RFC 9110 section 5.6.2
_SAFE = re.compile(r"^[\x20-\x7E]*$")
_SENTINEL = re.compile(r"^=\?base64\?(?P<payload>.*)\?=$")
_DECIMAL = re.compile(r"^-?[0-9]+(\.[0-9]+)?$")
_TYPES = frozenset({"string", "integer", "boolean"})
_SINGLE = frozenset({"items", "contains", "unevaluatedItems", "additionalProperties",
                     "propertyNames", "unevaluatedProperties", "not", "if", "then", "else",
                     "contentSchema"})
_LIST = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_MAP = frozenset({"patternProperties", "dependentSchemas", "$defs", "definitions"})

Annotations = list[tuple[tuple[str, ...], str, str]] | None
"""What :func:`header_annotations` found in a schema: ``(property path, token, type)`` per
``x-mcp-header``, or ``None`` when an annotation is invalid. It depends on the schema only, so
it is computed once per tool (:meth:`gateway.mcp.catalogue.ToolCatalogue.annotations`)."""


def _positions(root: Any) -> Iterator[tuple[tuple[str, ...] | None, dict[str, Any]]]:
    """Every schema position with its ``properties`` path (``None`` once off that chain)."""
    stack: list[tuple[tuple[str, ...] | None, Any]] = [((), root)]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            continue
        yield path, node
        for key, value in node.items():
            if key == "properties" and isinstance(value, dict):
                stack.extend(((*path, name) if path is not None else None, sub)
                             for name, sub in value.items())
            elif key in _SINGLE:
                stack.append((None, value))
            elif key in _LIST and isinstance(value, list):
                stack.extend((None, sub) for sub in value)
            elif key in _MAP and isinstance(value, dict):
                stack.extend((None, sub) for sub in value.values())


def header_annotations(schema: Any) -> Annotations:
    """The ``(property path, token, type)`` of each ``x-mcp-header`` of ``schema``; ``None``
    when an annotation is invalid (clients then drop the tool, and nothing is checked)."""
    found: list[tuple[tuple[str, ...], str, str]] = []
    seen: set[str] = set()
    for path, node in _positions(schema):
        if "x-mcp-header" not in node:
            continue
        token, kind = node["x-mcp-header"], node.get("type")
        if (not path or not isinstance(token, str) or not _TOKEN.match(token)
                or kind not in _TYPES or token.lower() in seen):
            return None
        seen.add(token.lower())
        found.append((path, token, kind))
    return found


def param_lines(raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The ``Mcp-Param-*`` lines of an ASGI header list (lower-case names, repeats kept)."""
    return [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in raw
            if name.lower().startswith(PARAM_PREFIX.encode())]


def _value(arguments: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = arguments
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def _render(value: Any) -> str | None:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        try:
            return str(value)
        except ValueError:  # an int beyond the int-to-str digit limit
            return None
    return None


def _encode(value: str) -> str:
    if _SAFE.match(value) and value == value.strip() and not _SENTINEL.match(value):
        return value
    return "=?base64?" + base64.b64encode(value.encode("utf-8")).decode("ascii") + "?="


def _decode(value: str) -> str | None:
    m = _SENTINEL.match(value)
    if m is None:
        return value
    try:
        raw = base64.b64decode(m.group("payload"), validate=True)
    except (binascii.Error, ValueError):
        return None
    if base64.b64encode(raw).decode("ascii") != m.group("payload"):
        return None  # not canonical
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _matches(kind: str, value: Any, rendered: str, decoded: str) -> bool:
    if (kind == "integer" and not isinstance(value, bool)
            and (isinstance(value, int) or (isinstance(value, float) and value.is_integer()))
            and _DECIMAL.match(decoded)):
        whole, _, fraction = decoded.partition(".")
        return not fraction.strip("0") and int(whole) == int(value)
    return decoded == rendered


def check_param_headers(schema: Any, arguments: Mapping[str, Any],
                        raw_headers: list[tuple[str, str]]) -> None:
    """Check the client's ``Mcp-Param-*`` headers against the arguments, by the tool's
    ``inputSchema`` ``schema`` (:func:`check_params` with its :func:`header_annotations`)."""
    check_params(header_annotations(schema), arguments, raw_headers)


def check_params(declared: Annotations, arguments: Mapping[str, Any],
                 raw_headers: list[tuple[str, str]]) -> None:
    """Check the client's ``Mcp-Param-*`` headers against the arguments.

    Args:
        declared: The annotations of the tool's ``inputSchema`` (:func:`header_annotations`).
        arguments: The ``tools/call`` arguments as the client sent them.
        raw_headers: The request's ``Mcp-Param-*`` header lines (lower-case names, in order,
            repeats kept).

    Raises:
        McpRefusal: 400, ``-32020`` ``header_mismatch``: a repeated header, a header without
            its argument, an argument without its header, a malformed sentinel, or unequal.
    """
    names = [name for name, _ in raw_headers]
    repeated = {name for name in names if names.count(name) > 1}
    if repeated:
        raise _mismatch(f"{sorted(repeated)[0]} appears more than once")
    if declared is None:
        return
    given = dict(raw_headers)
    for path, token, kind in declared:
        header = PARAM_PREFIX + token.lower()
        raw = given.get(header)
        value = _value(arguments, path)
        rendered = _render(value) if value is not None else None
        if rendered is None:
            if raw is not None:
                raise _mismatch(f"Mcp-Param-{token} has no argument {'.'.join(path)!r} to match")
            continue
        if raw is None:
            raise _mismatch(f"Mcp-Param-{token} is missing for argument {'.'.join(path)!r}")
        decoded = _decode(raw)
        if decoded is None:
            raise _mismatch(f"Mcp-Param-{token} has a malformed base64 value")
        if not _matches(kind, value, rendered, decoded):
            raise _mismatch(f"Mcp-Param-{token} does not match argument {'.'.join(path)!r}")


def param_headers(schema: Any, arguments: Mapping[str, Any]) -> dict[str, str]:
    """The ``Mcp-Param-*`` headers (lower-case names) mirroring ``arguments`` per ``schema``."""
    return mirror_params(header_annotations(schema), arguments)


def mirror_params(declared: Annotations, arguments: Mapping[str, Any]) -> dict[str, str]:
    """The ``Mcp-Param-*`` headers (lower-case names) mirroring ``arguments`` per the
    annotations ``declared`` (:func:`header_annotations`)."""
    out: dict[str, str] = {}
    for path, token, _ in declared or ():
        value = _value(arguments, path)
        rendered = _render(value) if value is not None else None
        if rendered is not None:
            out[PARAM_PREFIX + token.lower()] = _encode(rendered)
    return out


def _mismatch(text: str) -> McpRefusal:
    return McpRefusal(400, HEADER_MISMATCH, "header_mismatch", f"Header mismatch: {text}")
