"""Argument checks of a tool call, made before any byte is forwarded.

1. Size: the serialised ``arguments`` object against the tool's (or the default) limit.
2. Shape: JSON-schema validation against the tool's own ``inputSchema`` (from the server's
   ``tools/list``, :mod:`gateway.mcp.catalogue`), with the validator class the schema's
   ``$schema`` names (default draft 2020-12, as MCP 2025-11-25 and later specify); arguments
   a quick test can tell are valid skip the full validation
   (:mod:`gateway.mcp.schema_accept`).
3. Reach: each declared URL/host argument must use a scheme the tool allows (``http`` and
   ``https`` unless the tool's ``url_schemes`` widens it) and is put through the egress
   policy's one check, :func:`policy.check_target` (every IPv4/IPv6 spelling the guard
   parses, always-denied metadata and link-local addresses, names no destination names
   refused without DNS, names a destination names resolved and checked against its
   ``resolves_to``), and then the policy must allow the caller's data class to that destination.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jsonschema
from jsonschema.exceptions import SchemaError

from gateway.mcp.jsonrpc import FORBIDDEN, INVALID_PARAMS, McpRefusal
from gateway.mcp.schema_accept import Acceptor, acceptor
from policy import EgressDenied, EgressMatcher, Policy, check_target
from policy import Principal as PolicyPrincipal

__all__ = [
    "DEFAULT_URL_SCHEMES", "CompiledSchema", "argument_bytes", "check_schema", "check_size",
    "check_url_arguments", "compile_schema",
]

# Characters on which URL parsers disagree about the host (see _host_port).
_CANONICAL = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False)
"""The canonical encoder (built once: ``json.dumps`` with these options builds one per call)."""
_AMBIGUOUS = re.compile(r"[\x00-\x20\x7f\\]")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}
# The schemes a URL argument may use when the tool's settings do not widen them.
DEFAULT_URL_SCHEMES: frozenset[str] = frozenset({"http", "https"})


def argument_bytes(arguments: Any) -> bytes:
    """The canonical serialisation of ``arguments`` (hashed for the audit record)."""
    return _CANONICAL.encode(arguments).encode("utf-8")


def check_size(encoded: bytes, limit: int, what: str = "arguments") -> None:
    """Refuse ``arguments`` (or, ``what="params"``, the other forwarded ``params``: ``_meta``
    and any other key) larger than ``limit`` bytes.

    Raises:
        McpRefusal: 413 ``arguments_too_large`` / ``params_too_large``.
    """
    if len(encoded) > limit:
        label = "tool arguments" if what == "arguments" else "params other than the arguments"
        raise McpRefusal(413, INVALID_PARAMS, f"{what}_too_large",
                         f"{label} are {len(encoded)} bytes, above the limit of {limit}")


@dataclass(frozen=True, slots=True)
class CompiledSchema:
    """A tool's ``inputSchema`` made ready for validation (:func:`compile_schema`).

    Attributes:
        validator: The ``jsonschema`` validator (the class the schema's ``$schema`` names).
        accept: Its quick acceptance test (:mod:`gateway.mcp.schema_accept`), ``None`` when
            the schema is beyond it.
    """

    validator: Any
    accept: Acceptor | None


def check_schema(arguments: Any, schema: Mapping[str, Any] | None,
                 compiled: CompiledSchema | None = None) -> None:
    """Validate ``arguments`` against the tool's ``inputSchema``: accepted at once by the
    quick test when it can tell, else validated by ``jsonschema``.

    Args:
        arguments: The call's arguments.
        schema: The tool's ``inputSchema``.
        compiled: The schema compiled (:func:`compile_schema`), if cached.

    Raises:
        McpRefusal: 400 ``schema_invalid`` (the arguments do not match; the message names the
            JSON path, never the value) or 502 ``tool_schema_invalid`` (the server's schema).
    """
    if schema is None:
        return
    if compiled is None:
        compiled = compile_schema(schema)
    if compiled.accept is not None and compiled.accept(arguments):
        return
    error = jsonschema.exceptions.best_match(compiled.validator.iter_errors(arguments))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise McpRefusal(400, INVALID_PARAMS, "schema_invalid",
                         f"arguments do not match the tool's inputSchema at {where}: "
                         f"{error.validator} {error.validator_value!r}"[:300])


def compile_schema(schema: Mapping[str, Any]) -> CompiledSchema:
    """The validator of ``schema`` (the class its ``$schema`` names, default 2020-12) and its
    quick acceptance test.

    Raises:
        McpRefusal: 502 ``tool_schema_invalid``.
    """
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        raise McpRefusal(
            502, INVALID_PARAMS, "tool_schema_invalid",
            "the server's inputSchema for this tool is not a valid JSON schema") from exc
    return CompiledSchema(cls(schema), acceptor(schema, cls))


def _host_port(value: str, schemes: frozenset[str] = DEFAULT_URL_SCHEMES) -> tuple[str, int]:
    """The host and port the URL (or bare ``host[:port]``, read as ``http``) ``value`` names.

    Only a scheme in ``schemes`` (lower case) is accepted: an allowed host is not a licence
    to speak ``ftp`` or ``gopher`` to it (gopher lets a caller write raw bytes to any port).

    A backslash, space or control character inside the value is refused: URL parsers read
    them differently (``http://A\\@B/`` is host B to :func:`urllib.parse.urlsplit`, host A to
    urllib3 and to WHATWG parsers such as browsers and Node ``fetch``), so the host checked
    here could differ from the host the tool connects to.

    Raises:
        McpRefusal: 400 ``url_invalid``.
    """
    text = value.strip()
    if _AMBIGUOUS.search(text):
        raise McpRefusal(400, INVALID_PARAMS, "url_invalid",
                         "URL argument contains a backslash, a space or a control character "
                         "(URL parsers disagree on its host)")
    if "//" not in text:
        text = "http://" + text  # a bare host or host:port
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise McpRefusal(400, INVALID_PARAMS, "url_invalid", "URL argument is not a URL") from exc
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise McpRefusal(400, INVALID_PARAMS, "url_invalid",
                         f"URL argument scheme {scheme[:32]!r} is not allowed for this tool "
                         f"(allowed: {', '.join(sorted(schemes))})")
    host = parts.hostname
    if not host:
        raise McpRefusal(400, INVALID_PARAMS, "url_invalid", "URL argument has no host")
    return host, port or _DEFAULT_PORTS.get(scheme, 80)


async def _resolve(name: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=1)
    return [str(info[4][0]) for info in infos]


async def check_url_arguments(
    arguments: Mapping[str, Any],
    names: list[str],
    matcher: EgressMatcher | None,
    policy: Policy | None,
    principal: PolicyPrincipal,
    data_class: str,
    schemes: frozenset[str] = DEFAULT_URL_SCHEMES,
) -> None:
    """Check each URL/host argument in ``names`` against the egress policy.

    Without a policy nothing may be reached through a URL argument (fail closed).

    Args:
        schemes: The URL schemes the tool may be given (lower case; the tool's
            ``url_schemes`` setting, default ``http`` and ``https``).

    Raises:
        McpRefusal: 400 ``url_invalid`` (not a string, an ambiguous character, a scheme not
            in ``schemes``, no host) or 403 ``url_denied`` naming the argument and the
            policy's reason.
    """
    for name in names:
        value = arguments.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise McpRefusal(400, INVALID_PARAMS, "url_invalid",
                             f"argument {name!r} is not a string")
        if matcher is None or policy is None:
            raise McpRefusal(403, FORBIDDEN, "url_denied",
                             f"argument {name!r}: no egress policy is configured")
        host, port = _host_port(value, schemes)
        try:
            target = await check_target(matcher, host, port, _resolve)
        except EgressDenied as exc:
            raise McpRefusal(403, FORBIDDEN, "url_denied",
                             f"argument {name!r}: {exc.message}") from exc
        except OSError as exc:
            raise McpRefusal(403, FORBIDDEN, "url_denied",
                             f"argument {name!r}: host does not resolve") from exc
        if target.destination_id is None:
            continue  # unsafe_allow_all: the policy logs that it restricts nothing
        decision = policy.evaluate(principal, data_class, target.destination_id)
        if not decision.allowed:
            raise McpRefusal(403, FORBIDDEN, "url_denied",
                             f"argument {name!r}: destination {target.destination_id} may not "
                             f"receive data class {data_class}: {decision.reason}")
