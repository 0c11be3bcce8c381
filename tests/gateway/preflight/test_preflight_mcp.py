"""``gateway preflight``'s mcp.destinations: every MCP server the gateway fronts lies inside a
destination of the egress policy in force (tool calls carry the prompt's data), and its token file
is readable; skipped without an ``mcp:`` section, failed without a policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import main
from gateway.preflight.checks import CHECKS
from gateway.preflight.continuous import DEFAULT_LIVE_CHECKS
from tests.gateway.helpers import config
from tests.gateway.mcp_gateway.harness import policy_text


def _check(capsys: pytest.CaptureFixture[str], tmp: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    main(["preflight", "--config", str(path), "--json"])
    report = json.loads(capsys.readouterr().out)
    check: dict[str, Any] = next(c for c in report["checks"] if c["id"] == "mcp.destinations")
    return check


def _cfg(tmp: Path, mcp_url: str, *, policy: bool = True,
         token: Path | None = None) -> dict[str, Any]:
    cfg = config(["http://127.0.0.1:9"])
    server: dict[str, Any] = {"name": "docs", "url": mcp_url, "destination": "tools-docs"}
    if token is not None:
        server["auth_token_file"] = str(token)
    cfg["mcp"] = {"servers": [server]}
    if policy:
        pfile = tmp / "policy.yaml"
        pfile.write_text(policy_text({"model": 9, "tools-docs": 7100}))
        cfg["policy"] = {"file": str(pfile)}
        cfg["models"][0]["replicas"][0]["destination"] = "model"
    return cfg


def test_mcp_check_runs_in_the_preflight_and_in_the_running_gateway() -> None:
    assert any(c.__name__ == "check_mcp" for c in CHECKS)
    assert any(c.__name__ == "check_mcp" for c in DEFAULT_LIVE_CHECKS)
    assert any(c.__name__ == "check_identity" for c in DEFAULT_LIVE_CHECKS)


def test_no_mcp_section_is_skipped(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KEY", "x")
    assert _check(capsys, tmp_path, config(["http://127.0.0.1:9"]))["status"] == "skip"


def test_a_server_inside_its_destination_passes(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KEY", "x")
    check = _check(capsys, tmp_path, _cfg(tmp_path, "http://127.0.0.1:7100/mcp"))
    assert check["status"] == "pass", check
    assert check["evidence"]["servers"] == [
        {"name": "docs", "host": "127.0.0.1", "destination": "tools-docs"}]


def test_a_server_outside_its_destination_or_without_a_policy_fails(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KEY", "x")
    # The URL's port is not the destination's: a tool call would leave the policy's bounds.
    check = _check(capsys, tmp_path, _cfg(tmp_path, "http://127.0.0.1:7999/mcp"))
    assert check["status"] == "fail" and "mcp.servers[0].destination" in check["verdict"]
    check = _check(capsys, tmp_path, _cfg(tmp_path, "http://127.0.0.1:7100/mcp", policy=False))
    assert check["status"] == "fail" and "no egress policy" in check["verdict"]


def test_a_missing_token_file_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KEY", "x")
    cfg = _cfg(tmp_path, "http://127.0.0.1:7100/mcp", token=tmp_path / "missing.token")
    check = _check(capsys, tmp_path, cfg)
    assert check["status"] == "fail" and "auth_token_file" in check["verdict"], check


def test_a_bad_session_key_file_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KEY", "x")
    key = tmp_path / "mcp-session.key"
    key.write_text("c2hvcnQ=\n")  # 5 bytes
    cfg = _cfg(tmp_path, "http://127.0.0.1:7100/mcp")
    cfg["mcp"]["session_key_file"] = str(key)
    check = _check(capsys, tmp_path, cfg)
    assert check["status"] == "fail", check
    assert "mcp.session_key_file" in check["verdict"] and "at least 32 bytes" in check["verdict"]


def test_oauth_settings_that_disagree_with_the_identity_section_fail(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Token issuers without ``resource_metadata`` (every token refused at /mcp/...), or an
    ``authorization_servers`` entry that is not an issuer (clients sent for tokens that will
    not verify): the check names the key; agreeing settings pass."""
    from tests.gateway.identity.jwtkit import ISSUER, SigningKey, identity_section, write_jwks

    monkeypatch.setenv("VLLM_KEY", "x")
    jwks = tmp_path / "jwks.json"
    cfg = _cfg(tmp_path, "http://127.0.0.1:7100/mcp")
    cfg["identity"] = identity_section(jwks, write_jwks(jwks, SigningKey("k1")))
    check = _check(capsys, tmp_path, cfg)
    assert check["status"] == "fail" and "mcp.resource_metadata: not set" in check["verdict"]
    cfg["mcp"]["resource_metadata"] = {"resource": "https://gw.example.eu",
                                       "authorization_servers": ["https://other.example"]}
    check = _check(capsys, tmp_path, cfg)
    assert check["status"] == "fail", check
    assert "authorization_servers[0]: https://other.example" in check["verdict"]
    cfg["mcp"]["resource_metadata"]["authorization_servers"] = [ISSUER]
    assert _check(capsys, tmp_path, cfg)["status"] == "pass"
