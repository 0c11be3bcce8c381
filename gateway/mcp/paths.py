"""The URL paths the MCP endpoint answers (kept import-light: the app's dispatch reads them)."""

__all__ = ["AGGREGATE", "PREFIX", "WELL_KNOWN"]

PREFIX = "/mcp/"
"""``/mcp/<server-name>``: one Streamable HTTP endpoint per declared server."""
AGGREGATE = "/mcp"
"""One endpoint merging the tools of every server (``mcp.aggregate: true``)."""
WELL_KNOWN = "/.well-known/oauth-protected-resource"
"""RFC 9728 protected-resource metadata (and ``.../mcp/<server-name>``)."""
