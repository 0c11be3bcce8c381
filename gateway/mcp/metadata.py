"""OAuth 2.0 Protected Resource Metadata (RFC 9728) of the MCP endpoints.

MCP's authorization (2025-06-18 and later) makes the MCP endpoint an OAuth protected
resource: a 401 carries ``WWW-Authenticate: Bearer resource_metadata="<url>"`` and the
metadata document names the authorization servers whose tokens the gateway accepts. For the
resource ``<base>/mcp/<name>`` the document is served at
``<base>/.well-known/oauth-protected-resource/mcp/<name>`` (RFC 9728 section 3.1: the
well-known segment inserted between host and path), and ``resource`` is that resource's URL
exactly (section 3.3): the same URI a bearer token presented there must name in ``aud``
(:mod:`gateway.mcp.oauth`). The values come from ``mcp.resource_metadata``.
"""

from __future__ import annotations

from typing import Any

from gateway.mcp.paths import WELL_KNOWN
from gateway.mcp.settings import McpResourceMetadata, McpSettings

__all__ = ["metadata_document", "metadata_url", "resource_uri", "scopes_of"]



def _base(meta: McpResourceMetadata) -> str:
    return meta.resource.rstrip("/")


def resource_uri(meta: McpResourceMetadata, server: str | None) -> str:
    """The canonical URI of ``/mcp/<server>`` (``None``: the aggregate ``/mcp``): the
    ``resource`` of its metadata document and the ``aud`` its tokens must carry."""
    return f"{_base(meta)}/mcp" + (f"/{server}" if server is not None else "")


def metadata_url(meta: McpResourceMetadata, server: str | None) -> str:
    """The metadata URL announced in the 401 of ``/mcp/<server>`` (``None``: ``/mcp``)."""
    return f"{_base(meta)}{WELL_KNOWN}/mcp" + (f"/{server}" if server is not None else "")


def scopes_of(settings: McpSettings, server: str | None, tool: str | None = None) -> list[str]:
    """The scopes a bearer token needs for a request (``resource_metadata.required_scopes``,
    then the server's ``scopes``, then the tool's), in that order without repeats.

    Args:
        settings: The ``mcp:`` section.
        server: The server the request goes to (``None``: the aggregate itself).
        tool: The tool of a ``tools/call`` (``None``: another method).
    """
    meta = settings.resource_metadata
    out: list[str] = list(meta.required_scopes) if meta is not None else []
    declared = next((s for s in settings.servers if s.name == server), None)
    if declared is not None:
        out.extend(declared.scopes)
        if tool is not None and tool in declared.tools:
            out.extend(declared.tools[tool].scopes)
    return list(dict.fromkeys(out))


def _supported(settings: McpSettings, servers: list[str]) -> list[str]:
    """Every scope the resource's requests may need (its servers' and their tools')."""
    out = scopes_of(settings, None)
    for server in settings.servers:
        if server.name in servers:
            out.extend(server.scopes)
            out.extend(s for tool in server.tools.values() for s in tool.scopes)
    return list(dict.fromkeys(out))


def metadata_document(settings: McpSettings, path: str) -> dict[str, Any] | None:
    """The RFC 9728 document served at ``path``, or ``None`` (404) for another path or
    without ``resource_metadata``.

    Args:
        settings: The ``mcp:`` section.
        path: The request path (``/.well-known/oauth-protected-resource[/mcp[/<name>]]``).
    """
    meta = settings.resource_metadata
    if meta is None:
        return None
    names = [s.name for s in settings.servers]
    rest = path[len(WELL_KNOWN):]
    if rest in ("", "/"):
        resource, servers = _base(meta), names
    elif rest.startswith("/mcp/") and rest[5:] in names:
        resource, servers = resource_uri(meta, rest[5:]), [rest[5:]]
    elif settings.aggregate and rest == "/mcp":
        resource, servers = resource_uri(meta, None), names
    else:
        return None
    doc: dict[str, Any] = {
        "resource": resource,
        "authorization_servers": list(meta.authorization_servers),
        "bearer_methods_supported": ["header"],
    }
    scopes = list(meta.scopes_supported) or _supported(settings, servers)
    if scopes:
        doc["scopes_supported"] = scopes
    if meta.resource_name:
        doc["resource_name"] = meta.resource_name
    return doc
