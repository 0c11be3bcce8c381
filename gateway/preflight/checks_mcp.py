"""The MCP check: every MCP server the gateway fronts is a destination of the egress policy.

``mcp.destinations`` runs when the config has an ``mcp:`` section (:mod:`gateway.mcp`): an agent's
tool calls carry the prompt's data to those servers, so each must name a policy destination
whose URL it lies in (the binding :func:`gateway.mcp.wiring.check_mcp_destinations` checks at
start, here against the policy in force now), and the token file the gateway sends upstream
must be readable. Without an egress policy nothing bounds where tool calls go: that fails. The
endpoints' OAuth settings must agree with the ``identity:`` section
(:func:`gateway.mcp.oauth.oauth_problems`).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from gateway.preflight.inputs import Facts
from gateway.preflight.report import CheckResult

__all__ = ["check_mcp"]


def check_mcp(facts: Facts) -> CheckResult:
    """The MCP servers are bound to policy destinations (and their token files and the session
    key file readable)."""
    from gateway.errors import ConfigError
    from gateway.mcp.oauth import oauth_problems
    from gateway.mcp.wiring import check_mcp_destinations

    cid, title, crit = ("mcp.destinations",
                        "MCP servers are egress destinations of the policy",
                        ("SOV-3", "SOV-7", "AIA-12"))
    settings = facts.settings
    section = getattr(settings, "mcp", None) if settings is not None else None
    if section is None:
        return CheckResult(cid, title, "skip", "no mcp: section (no MCP endpoint)", {}, crit)
    evidence = {"servers": [{"name": s.name, "host": urlsplit(s.url).hostname,
                             "destination": s.destination} for s in section.servers]}
    if facts.policy is None:
        return CheckResult(cid, title, "fail", f"{len(section.servers)} MCP server(s) but no "
                           "egress policy: nothing bounds where tool calls go", evidence, crit)
    problems: list[str] = []
    try:
        check_mcp_destinations(section, facts.policy)
    except ConfigError as exc:
        problems.extend(exc.message.splitlines())
    for i, server in enumerate(section.servers):
        token = server.auth_token_file
        if token is not None and not token.is_file():
            problems.append(f"mcp.servers[{i}].auth_token_file: {token} is not a readable file")
    if section.session_key_file is not None:
        from gateway.mcp.sessions import load_session_key

        try:
            load_session_key(section.session_key_file)
        except ValueError as exc:
            problems.append(f"mcp.session_key_file: {exc}")
    problems.extend(oauth_problems(section, getattr(settings, "identity", None)))
    if problems:
        return CheckResult(cid, title, "fail", "; ".join(problems), evidence, crit)
    return CheckResult(cid, title, "pass", f"{len(section.servers)} MCP server(s), each inside "
                       "its policy destination", evidence, crit)
