"""How ``identity.routes`` entries match request paths (:meth:`IdentitySettings.accepted`) and
which entries the configuration refuses; the same rule is tried through real gateways in
``tests/gateway/mcp_gateway/test_mcp_identity_routes.py`` and ``test_batch_identity.py``."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.auth import canonical_path
from gateway.identity.settings import IdentitySettings


def _section(routes: dict[str, list[str]]) -> IdentitySettings:
    return IdentitySettings.model_validate({"accept": ["key", "jwt"], "routes": routes})


@pytest.mark.parametrize(("path", "canonical"), [
    ("/", "/"), ("", "/"), ("//", "/"), ("/mcp/tools", "/mcp/tools"), ("/mcp/tools/", "/mcp/tools"),
    ("/mcp//tools///", "/mcp/tools"), ("mcp", "/mcp"),
])
def test_canonical_path(path: str, canonical: str) -> None:
    assert canonical_path(path) == canonical


def test_an_entry_covers_its_path_and_the_paths_under_it_the_longest_wins() -> None:
    s = _section({"/mcp": ["jwt"], "/mcp/tools/": ["key"], "/v1/files": ["key"]})
    assert s.routes == {"/mcp": ["jwt"], "/mcp/tools": ["key"], "/v1/files": ["key"]}
    got = {p: s.accepted(p) for p in [
        "/mcp", "/mcp/", "/mcp/notes", "/mcp/tools", "/mcp/tools/", "/mcp//tools",
        "/mcp/tools/x", "/mcp/toolsx", "/v1/files/f-1/content", "/v1/filesystem", "/"]}
    assert got == {
        "/mcp": ["jwt"], "/mcp/": ["jwt"], "/mcp/notes": ["jwt"], "/mcp/tools": ["key"],
        "/mcp/tools/": ["key"], "/mcp//tools": ["key"], "/mcp/tools/x": ["key"],
        "/mcp/toolsx": ["jwt"], "/v1/files/f-1/content": ["key"],
        "/v1/filesystem": ["key", "jwt"], "/": ["key", "jwt"],
    }


@pytest.mark.parametrize(("routes", "problem"), [
    ({"v1/files": ["key"]}, "literal path starting with '/'"),
    ({"/mcp/tools%2f": ["key"]}, "no percent-escapes"),
    ({"/v1/files?x=1": ["key"]}, "no percent-escapes, query"),
    ({"/v1/../files": ["key"]}, "'..' segments"),
    ({"/v1/files": ["key"], "/v1/files/": ["jwt"]}, "the same path as another entry"),
    ({"/v1/files": []}, "at least one credential"),
])
def test_an_entry_that_could_never_match_as_written_is_refused(
        routes: dict[str, list[str]], problem: str) -> None:
    with pytest.raises(ValidationError, match="routes") as info:
        _section(routes)
    assert problem in str(info.value)
