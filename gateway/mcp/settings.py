"""The ``mcp:`` section: the MCP servers the gateway fronts and who may call which tool.

Example::

    mcp:
      servers:
        - name: search
          url: http://10.0.0.30:8080/mcp
          destination: tools-eu          # an egress policy destination, as for replicas
          auth_token_file: /run/secrets/search-token   # injected upstream, never passed through
          tools:
            fetch: {url_arguments: [url], max_argument_bytes: 4096}
      access:
        - keys: ["agent-*"]
          servers: ["search"]
          allow: ["*"]
          deny: ["delete_*"]
          prompts: {allow: ["summarise"]}          # prompts/get, prompts/list, completions
          resources: {allow: ["docs://public/*"]}  # resources/read, lists, subscriptions
      aggregate: true                  # /mcp: every server's tools as <server>__<tool>
      session_key_file: /run/secrets/mcp-session.key   # shared by workers and replicas
      resource_metadata:               # RFC 9728 protected resource (gateway.mcp.oauth)
        resource: https://gw.example.eu   # canonical base: /mcp/search is <resource>/mcp/search
        authorization_servers: [https://id.example.eu]
        required_scopes: [mcp]         # every token at every MCP endpoint (403 otherwise)

Sizes are bytes, durations seconds. Local (stdio) servers are out of scope: every server is an
HTTP endpoint and an egress destination.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from gateway.config.base import FrozenSection
from gateway.serving.settings import is_loopback_host

__all__ = [
    "AGGREGATE_SEPARATOR",
    "McpAccessRule",
    "McpFlowSettings",
    "McpGlobs",
    "McpLimits",
    "McpResourceMetadata",
    "McpServerSettings",
    "McpSettings",
    "McpToolSettings",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# RFC 6749 section 3.3: scope-token = 1*( %x21 / %x23-5B / %x5D-7E ); goes into a header.
_SCOPE = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]{1,128}$")


def _scope_tokens(value: list[str]) -> list[str]:
    bad = [s for s in value if not _SCOPE.match(s)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not an OAuth scope token (RFC 6749 section 3.3: "
                         "printable ASCII without space, '\"' or '\\')")
    return value


class McpToolSettings(FrozenSection):
    """Argument checks declared for one tool (applied before the call is forwarded).

    Attributes:
        url_arguments: Argument names (top-level keys) holding a URL or host the tool will
            reach: each is checked against the egress policy for the caller's data class.
        url_schemes: The URL schemes those arguments may use (lower case; default ``http``
            and ``https``); another scheme is refused 400 ``url_invalid``. Widen only for a
            tool that needs it (``ftp``, ...): the policy checks the host, not the protocol.
        max_argument_bytes: Largest serialised ``arguments`` object of this tool (bytes).
        scopes: OAuth scopes a bearer token must grant to call this tool (beside the
            server's and ``resource_metadata.required_scopes``; else 403
            ``insufficient_scope``). API keys and client certificates are not scoped.
    """

    url_arguments: list[str] = Field(default_factory=list)
    url_schemes: frozenset[str] = frozenset({"http", "https"})
    max_argument_bytes: int | None = Field(default=None, gt=0)
    scopes: list[str] = Field(default_factory=list)

    _scopes = field_validator("scopes")(_scope_tokens)

    @field_validator("url_schemes")
    @classmethod
    def _schemes_are_schemes(cls, value: frozenset[str]) -> frozenset[str]:
        # RFC 3986 scheme syntax, compared in lower case as urlsplit reports it.
        bad = sorted(s for s in value if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", s))
        if bad or not value:
            raise ValueError(f"not URL schemes: {bad}" if bad else "at least one scheme")
        return frozenset(s.lower() for s in value)


class McpFlowSettings(FrozenSection):
    """Flow control of one server (:class:`gateway.mcp.limits.ServerGate`).

    Attributes:
        max_concurrent: Requests forwarded to the server at the same time.
        max_queued: Requests waiting for a slot (arrival order); more are refused (503).
        queue_timeout_s: Longest wait for a slot in seconds; then refused (503).
    """

    max_concurrent: int = Field(gt=0)
    max_queued: int = Field(default=0, ge=0)
    queue_timeout_s: float = Field(default=5.0, gt=0, allow_inf_nan=False)


class McpServerSettings(FrozenSection):
    """One upstream MCP server (Streamable HTTP), served at ``/mcp/<name>``.

    Attributes:
        name: Path segment and audit name (letters, digits, ``._-``).
        url: The server's MCP endpoint (``http(s)://host:port/path``).
        destination: Egress policy destination the URL lies in (required with a policy).
        auth_token_file: File holding the bearer token the gateway sends upstream (a mounted
            Secret); the client's own ``Authorization`` is never forwarded.
        tools: Per-tool argument checks by tool name.
        flow: Concurrency cap and queue of this server (``None``: no cap).
        scopes: OAuth scopes a bearer token must grant for any request to this server (at
            ``/mcp/<name>``, and its tools' calls at ``/mcp``), beside
            ``resource_metadata.required_scopes``.
    """

    name: str
    url: str
    destination: str | None = None
    auth_token_file: Path | None = None
    tools: dict[str, McpToolSettings] = Field(default_factory=dict)
    flow: McpFlowSettings | None = None
    scopes: list[str] = Field(default_factory=list)

    _scopes = field_validator("scopes")(_scope_tokens)

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be 1-64 characters of letters, digits and ._- (a path segment)")
        return value

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/?#]+", value):
            raise ValueError("must be an http:// or https:// URL (stdio servers are out of scope)")
        return value


class McpGlobs(FrozenSection):
    """Allow and deny globs (``fnmatch``, case-sensitive) of prompt names or resource URIs."""

    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)


class McpAccessRule(FrozenSection):
    """What of which servers the matching callers may use (globs, ``fnmatch``).

    A caller matches when its key id matches one of ``keys`` or its team one of ``teams``.
    A tool is callable when some matching rule for the server allows it (``allow``) and no
    matching rule denies it (``deny``; deny wins; nothing matches: refused). Prompts (by name)
    and resources (by URI; resource templates by their ``uriTemplate``) are judged the same
    way by ``prompts`` and ``resources``: none is allowed unless a rule says so.
    """

    keys: list[str] = Field(default_factory=list)
    teams: list[str] = Field(default_factory=list)
    servers: list[str] = Field(default_factory=lambda: ["*"])
    allow: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    prompts: McpGlobs = Field(default_factory=McpGlobs)
    resources: McpGlobs = Field(default_factory=McpGlobs)


class McpLimits(FrozenSection):
    """Bounds of one MCP request (bytes, seconds, counts)."""

    max_request_bytes: int = Field(default=1024 * 1024, gt=0)
    max_argument_bytes: int = Field(default=256 * 1024, gt=0)
    max_response_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    max_event_bytes: int = Field(default=4 * 1024 * 1024, gt=0)
    call_timeout_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    idle_timeout_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    catalogue_ttl_s: float = Field(default=60.0, ge=0, allow_inf_nan=False)
    max_sessions: int = Field(default=10_000, gt=0)


class McpResourceMetadata(FrozenSection):
    """The MCP endpoints as OAuth 2.1 protected resources (:mod:`gateway.mcp.oauth`): their
    canonical URIs, which bearer tokens must name in ``aud`` (RFC 8707), the scopes they
    need, and the RFC 9728 metadata served at ``/.well-known/oauth-protected-resource`` (and
    ``.../mcp/<name>``, ``.../mcp``).

    Attributes:
        resource: The gateway's public origin as MCP clients reach it (``https://host[:port]``,
            no path; ``http://`` only to loopback). The resource of ``/mcp/<name>`` is
            ``<resource>/mcp/<name>``, of the aggregate ``<resource>/mcp``: the ``resource``
            of their metadata documents and the ``aud`` their tokens must carry.
        authorization_servers: Issuers (``iss``) whose tokens clients should get; each should
            be an ``identity.issuers`` entry, since only those verify.
        scopes_supported: Scopes announced in the metadata (empty: the configured
            ``required_scopes`` and servers' and tools' ``scopes`` relevant to the document).
        resource_name: Human-readable name announced in the metadata.
        required_scopes: Scopes every bearer token must grant at every MCP endpoint (else 403
            ``insufficient_scope`` naming the scopes needed).
    """

    resource: str
    authorization_servers: list[str] = Field(default_factory=list)
    scopes_supported: list[str] = Field(default_factory=list)
    resource_name: str | None = None
    required_scopes: list[str] = Field(default_factory=list)

    _scopes = field_validator("scopes_supported", "required_scopes")(_scope_tokens)

    @field_validator("resource")
    @classmethod
    def _origin(cls, value: str) -> str:
        parts = urlsplit(value)
        try:
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError as exc:
            raise ValueError(f"bad port in {value!r}") from exc
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError("must be the gateway's public origin, https://host[:port]")
        if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
            raise ValueError("must be an origin without path, query or fragment: the MCP "
                             "resources are <resource>/mcp/<name>, and RFC 9728 puts the "
                             "metadata at <origin>/.well-known/oauth-protected-resource/...")
        if not value.isascii():  # it goes into WWW-Authenticate and is compared with aud
            raise ValueError("must be ASCII: write an internationalised host in its xn-- form")
        if parts.scheme == "http" and not is_loopback_host(parts.hostname):
            raise ValueError("must be https:// (OAuth 2.1 section 1.5); http:// only to loopback")
        return value.rstrip("/")


AGGREGATE_SEPARATOR = "__"
"""Between server and tool name in the aggregate endpoint's tool names (``search__fetch``):
characters the MCP tool-name rules allow (2025-11-25 ``server/tools#tool-names``: letters,
digits, ``_-.``) and the model APIs' function names accept (no ``.``)."""


class McpSettings(FrozenSection):
    """The ``mcp:`` section (absent: no MCP endpoint).

    Attributes:
        aggregate: Serve ``/mcp`` too: one endpoint listing the tools of every server the
            caller may use as ``<server>__<tool>`` and routing each call to its server with
            the per-server checks (server names must then not contain ``__``).
        session_key_file: HMAC key of handshake-era session ids (base64 of >= 32 bytes, a
            mounted Secret shared by all workers and replicas); unset: random per process, so
            a 2025 client's session continues only in the process that opened it.
        uri_text: Resource URIs the caller may not read, found in the strings of a server's
            answer (``text``, ``structuredContent``, ``_meta``; :mod:`gateway.mcp.uritext`):
            ``redact`` them (default), ``refuse`` the message, or ``off`` (not searched).
    """

    servers: list[McpServerSettings] = Field(min_length=1)
    access: list[McpAccessRule] = Field(default_factory=list)
    limits: McpLimits = Field(default_factory=McpLimits)
    resource_metadata: McpResourceMetadata | None = None
    allowed_origins: list[str] = Field(default_factory=list)
    aggregate: bool = False
    session_key_file: Path | None = None
    uri_text: Literal["redact", "refuse", "off"] = "redact"

    @model_validator(mode="after")
    def _unique_names(self) -> McpSettings:
        seen: set[str] = set()
        for i, server in enumerate(self.servers):
            if server.name in seen:
                raise ValueError(f"servers[{i}].name: {server.name!r} is used twice")
            if self.aggregate and AGGREGATE_SEPARATOR in server.name:
                raise ValueError(f"servers[{i}].name: {server.name!r} contains "
                                 f"{AGGREGATE_SEPARATOR!r}, the aggregate endpoint's separator")
            seen.add(server.name)
        return self
