"""``gateway preflight``'s identity.configured: fails when identity is required and missing or
its pinned keys do not load, passes when they do, is skipped when not required."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.audit import generate_key_file
from gateway.cli import main
from tests.gateway.helpers import config
from tests.gateway.identity.jwtkit import SigningKey, identity_section, write_jwks


def _run(capsys: pytest.CaptureFixture[str], cfg: dict[str, Any], tmp: Path,
         *flags: str) -> dict[str, Any]:
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    main(["preflight", "--config", str(path), "--json", *flags])
    report = json.loads(capsys.readouterr().out)
    check: dict[str, Any] = next(c for c in report["checks"] if c["id"] == "identity.configured")
    return check


def _identity(tmp: Path) -> dict[str, Any]:
    jwks = tmp / "jwks.json"
    section = identity_section(jwks, write_jwks(jwks, SigningKey("k1")))
    section["pseudonym_key_file"] = str(generate_key_file(tmp / "pseudonym.key"))
    return section


def test_required_and_missing_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KEY", "x")
    cfg = config(["http://127.0.0.1:9"])
    assert _run(capsys, cfg, tmp_path)["status"] == "skip"
    check = _run(capsys, cfg, tmp_path, "--require-identity")
    assert check["status"] == "fail" and "no identity: section" in check["verdict"]


def test_configured_identity_passes_and_a_broken_pin_fails(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KEY", "x")
    section = _identity(tmp_path)
    section["required"] = True  # the chart's identity.required: no flag needed
    cfg = config(["http://127.0.0.1:9"], identity=section)
    check = _run(capsys, cfg, tmp_path)
    assert check["status"] == "pass", check
    assert check["evidence"]["jwks_sha256"] == [section["issuers"][0]["jwks_sha256"]]
    Path(section["issuers"][0]["jwks_file"]).write_text('{"keys": []}')
    check = _run(capsys, cfg, tmp_path)
    assert check["status"] == "fail" and "jwks_sha256" in check["verdict"]
