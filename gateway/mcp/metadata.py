"""OAuth 2.0 Protected Resource Metadata (RFC 9728) of the MCP endpoints.

MCP's authorization (2025-06-18 and later) makes the MCP endpoint an OAuth protected
resource: a 401 carries ``WWW-Authenticate: Bearer resource_metadata="<url>"`` and the
metadata document names the authorization servers whose tokens the gateway accepts. For the
resource ``<base>/mcp/<name>`` the document is served at
``<base>/.well-known/oauth-protected-resource/mcp/<name>`` (RFC 9728 section 3.1: the
well-known segment inserted between host and path), and ``resource`` is that resource's URL
exactly (section 3.3). The values come from ``mcp.resource_metadata``; token validation itself
is the authenticator's (API keys today, identity tokens through the same seam).
"""

from __future__ import annotations

from typing import Any

from gateway.mcp.paths import WELL_KNOWN
from gateway.mcp.settings import McpResourceMetadata

__all__ = ["metadata_document", "metadata_url"]



def _base(meta: McpResourceMetadata) -> str:
    return meta.resource.rstrip("/")


def metadata_url(meta: McpResourceMetadata, server: str | None) -> str:
    """The metadata URL announced in the 401 of ``/mcp/<server>`` (``None``: ``/mcp``)."""
    return f"{_base(meta)}{WELL_KNOWN}/mcp" + (f"/{server}" if server is not None else "")


def metadata_document(meta: McpResourceMetadata, path: str, servers: set[str],
                      aggregate: bool = False) -> dict[str, Any] | None:
    """The RFC 9728 document served at ``path``, or ``None`` (404) for another path.

    Args:
        meta: The configured metadata.
        path: The request path (``/.well-known/oauth-protected-resource[/mcp/<name>]``).
        servers: The declared server names.
        aggregate: The aggregate endpoint ``/mcp`` is on (its document at ``.../mcp``).
    """
    rest = path[len(WELL_KNOWN):]
    if rest in ("", "/"):
        resource = _base(meta)
    elif (rest.startswith("/mcp/") and rest[5:] in servers) or (aggregate and rest == "/mcp"):
        resource = f"{_base(meta)}{rest}"
    else:
        return None
    doc: dict[str, Any] = {
        "resource": resource,
        "authorization_servers": list(meta.authorization_servers),
        "bearer_methods_supported": ["header"],
    }
    if meta.scopes_supported:
        doc["scopes_supported"] = list(meta.scopes_supported)
    if meta.resource_name:
        doc["resource_name"] = meta.resource_name
    return doc
