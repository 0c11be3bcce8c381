"""Resource-bound tokens (RFC 8707): on a path bound to a resource (an MCP endpoint) a bearer
token must name that resource in ``aud``, and the issuer's own ``audiences`` are not accepted
there; elsewhere the reverse. The authenticator is the one ``gateway serve`` builds
(:func:`gateway.identity.build.wrap_identity`), with real RS256 tokens (PyJWT)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.audit import generate_key_file
from gateway.auth import KeyRing
from gateway.identity import IdentitySettings, TokenRejected
from gateway.identity.build import wrap_identity
from gateway.identity.resources import BoundResource, canonical_uri
from gateway.mcp.oauth import resource_bindings
from gateway.mcp.settings import McpResourceMetadata, McpSettings
from tests.gateway.identity.jwtkit import (
    AUDIENCE,
    ISSUER,
    SigningKey,
    identity_section,
    write_jwks,
)

MCP = "https://gw.example.eu/mcp/tools"


def _authenticator(tmp_path: Path, resources: dict[str, BoundResource]) -> tuple[Any, SigningKey]:
    signer = SigningKey("rsa-1")
    jwks = tmp_path / "jwks.json"
    section = identity_section(jwks, write_jwks(jwks, signer))
    section["pseudonym_key_file"] = str(generate_key_file(tmp_path / "pseudonym.key"))
    settings = SimpleNamespace(identity=IdentitySettings.model_validate(section), audit=None,
                               flow_control=None)
    return wrap_identity(settings, KeyRing(()), resources=resources), signer


def _at(path: str) -> dict[str, Any]:
    return {"type": "http", "path": path}


def test_a_token_is_accepted_only_on_the_paths_of_its_resource(tmp_path: Path) -> None:
    auth, signer = _authenticator(tmp_path, {"/mcp/tools": BoundResource(MCP, "x")})
    for_api, for_mcp = signer.token(), signer.token(aud=MCP, scope="mcp:tools other")
    # Each verified once where it belongs (and cached there)...
    assert auth.authenticate(for_api, _at("/v1/chat/completions")).team == "ml"
    principal = auth.authenticate(for_mcp, _at("/mcp/tools/"))
    assert principal.identity.scopes == frozenset({"mcp:tools", "other"})
    # ...and refused at the other, the verified-token cache notwithstanding.
    for token, path in ((for_api, "/mcp/tools"), (for_mcp, "/v1/chat/completions")):
        with pytest.raises(TokenRejected) as refused:
            auth.authenticate(token, _at(path))
        assert refused.value.code == "token_audience_invalid"
    # The refusal at the bound path still says who (for the audit), pseudonymised.
    with pytest.raises(TokenRejected) as refused:
        auth.authenticate(for_api, _at("/mcp/tools"))
    assert refused.value.identity is not None
    assert refused.value.identity["issuer"] == ISSUER and refused.value.identity["kid"] == "rsa-1"
    assert refused.value.identity["subject"].startswith("hmac-sha256:")
    # Other spellings of the same URI name the same resource; other URIs do not.
    for aud in ("HTTPS://GW.example.EU:443/mcp/tools/", [AUDIENCE, MCP]):
        assert auth.authenticate(signer.token(aud=aud), _at("/mcp/tools")).team == "ml"
    for aud in ("https://gw.example.eu/mcp", "https://gw.example.eu/mcp/tools2",
                "https://gw.example.eu:8443/mcp/tools", "http://gw.example.eu/mcp/tools",
                [AUDIENCE], None):
        with pytest.raises(TokenRejected) as refused:
            auth.authenticate(signer.token(aud=aud), _at("/mcp/tools"))
        assert refused.value.code == "token_audience_invalid", aud


def test_every_spelling_of_a_bound_path_is_bound(tmp_path: Path) -> None:
    """The MCP endpoint serves ``/mcp//tools`` and ``/mcp/tools//`` as ``/mcp/tools``
    (:func:`gateway.auth.canonical_path`): a token for the chat API must not pass there."""
    auth, signer = _authenticator(tmp_path, {"/mcp/tools": BoundResource(MCP, "x")})
    for_api, for_mcp = signer.token(), signer.token(aud=MCP)
    for path in ("/mcp//tools", "/mcp/tools//", "//mcp/tools", "/mcp/tools/"):
        with pytest.raises(TokenRejected) as refused:
            auth.authenticate(for_api, _at(path))
        assert refused.value.code == "token_audience_invalid", path
        assert auth.authenticate(for_mcp, _at(path)).team == "ml"


def test_a_bound_path_without_a_uri_refuses_every_token(tmp_path: Path) -> None:
    settings = McpSettings.model_validate({"servers": [{"name": "tools",
                                                        "url": "http://10.0.0.1/mcp"}]})
    bindings = resource_bindings(settings)
    assert bindings == {"/mcp/tools": BoundResource(None, "mcp.resource_metadata.resource")}
    auth, signer = _authenticator(tmp_path, bindings)
    with pytest.raises(TokenRejected) as refused:
        auth.authenticate(signer.token(), _at("/mcp/tools"))
    assert "mcp.resource_metadata.resource" in refused.value.message
    assert auth.authenticate(signer.token(), _at("/v1/models")).team == "ml"


def test_the_bindings_name_the_uris_the_metadata_serves() -> None:
    settings = McpSettings.model_validate({
        "servers": [{"name": "tools", "url": "http://10.0.0.1/mcp"}], "aggregate": True,
        "resource_metadata": {"resource": "https://gw.example.eu/"}})
    assert {p: b.uri for p, b in resource_bindings(settings).items()} == {
        "/mcp/tools": MCP, "/mcp": "https://gw.example.eu/mcp"}
    assert canonical_uri("https://GW.example.eu:443") == "https://gw.example.eu"
    for bad in ("https://gw.example.eu/mcp", "http://gw.example.eu", "https://gw.example.eu#x",
                "https://bücher.example"):
        with pytest.raises(ValueError, match="resource"):
            McpResourceMetadata(resource=bad)
