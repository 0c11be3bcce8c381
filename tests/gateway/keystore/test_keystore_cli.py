"""The managed key CLI: create/list/revoke/rotate, audited in the real audit log."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli.keys_managed import parse_duration
from tests.gateway.gateway_cli import CliResult, gateway
from tests.gateway.helpers import config as gateway_config

ROOT = Path(__file__).resolve().parents[3]
GATEWAY = [sys.executable, "-c", "import sys; from gateway.cli import main; sys.exit(main())"]


def run_gateway(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GATEWAY, *args], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )


@pytest.fixture
def audited(tmp_path: Path) -> tuple[Path, str]:
    """A gateway config with an audit section (real signing key) and its store URL."""
    key = tmp_path / "audit.key"
    done = run_gateway("audit", "keygen", "--out", str(key))
    assert done.returncode == 0, done.stderr
    pseudo = tmp_path / "pseudo.key"
    pseudo.write_text("c2VjcmV0LXBzZXVkb255bS1rZXktMzItYnl0ZXMtbG9uZyE=\n")
    store = f"sqlite://{tmp_path / 'audit.db'}"
    cfg = gateway_config(["http://127.0.0.1:9"])
    for model in cfg["models"]:
        model["replicas"] = [{"url": r["url"]} for r in model["replicas"]]
    cfg["audit"] = {
        "store": store,
        "signing_key_file": str(key),
        "pseudonym_key_file": str(pseudo),
        "replica_id": "test-replica",
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, store


def audit_records(store: str) -> list[dict[str, Any]]:
    done = run_gateway("audit", "export", "--store", store)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def invoke(*args: str) -> CliResult:
    return gateway("keys", *args)


def test_create_list_rotate_revoke_with_audit(audited: tuple[Path, str]) -> None:
    cfg, store = audited
    res = invoke(
        "create",
        "--team",
        "search",
        "--models",
        "llama,mistral",
        "--id",
        "ci-bot",
        "--expires",
        "30d",
        "--config",
        str(cfg),
        "--json",
    )
    assert res.exit_code == 0, res.output
    created = json.loads(res.output.strip().splitlines()[-1])
    token = created["key"]
    assert token.startswith("sg-") and created["id"] == "ci-bot"
    assert created["models"] == ["llama", "mistral"] and created["status"] == "active"

    res = invoke("list", "--config", str(cfg), "--json")
    assert res.exit_code == 0, res.output
    listed = json.loads(res.output)
    assert [k["id"] for k in listed] == ["ci-bot"] and token not in res.output

    res = invoke("rotate", "ci-bot", "--grace", "10m", "--config", str(cfg))
    assert res.exit_code == 0, res.output
    assert "rotated managed key ci-bot" in res.output and "stays valid until" in res.output

    res = invoke("revoke", "ci-bot", "--config", str(cfg))
    assert res.exit_code == 0, res.output
    res = invoke("list", "--config", str(cfg))
    assert "no managed keys" in res.output
    res = invoke("list", "--config", str(cfg), "--all")
    assert "ci-bot" in res.output and "revoked" in res.output

    records = audit_records(store)
    text = json.dumps(records)
    types = [r.get("type") for r in records]
    for expected in ("key.created", "key.rotated", "key.revoked"):
        assert expected in text, (expected, types)
    assert token not in text and hashlib.sha256(token.encode()).hexdigest() not in text
    done = run_gateway(
        "audit", "verify", "--store", store, "--public-key", str(cfg.parent / "audit.key.pub")
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_keys_need_no_backend_credentials(
    audited: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's config names ``api_key_env: VLLM_KEY``; managing keys from an operator's
    workstation refused with ``environment variable VLLM_KEY is not set``."""
    cfg, _ = audited
    doc = yaml.safe_load(cfg.read_text())
    doc["models"][0]["replicas"][0]["api_key_env"] = "VLLM_KEY"
    cfg.write_text(yaml.safe_dump(doc))
    monkeypatch.delenv("VLLM_KEY", raising=False)
    res = invoke("create", "--models", "llama-3.1-8b", "--id", "ops", "--config", str(cfg))
    assert res.exit_code == 0, res.output
    res = invoke("list", "--config", str(cfg))
    assert res.exit_code == 0 and "ops" in res.output, res.output
    doc["models"][0]["replicas"][0]["api_key"] = "inline-secret"
    cfg.write_text(yaml.safe_dump(doc))
    res = invoke("list", "--config", str(cfg))  # an inline key is still refused
    assert res.exit_code == 2 and "api_key: secrets do not belong in the file" in res.output


def test_changes_refuse_to_run_unaudited(tmp_path: Path) -> None:
    store = f"sqlite://{tmp_path / 'k.db'}"
    res = invoke("create", "--models", "m", "--store", store)
    assert res.exit_code == 2
    assert "must be audited" in res.output
    res = invoke("create", "--models", "m", "--store", store, "--no-audit", "--id", "x")
    assert res.exit_code == 0, res.output
    assert "NOT audited" in res.output


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    store = f"sqlite://{tmp_path / 'k.db'}"
    res = invoke("revoke", "nope", "--store", store, "--no-audit")
    assert res.exit_code == 2 and "key_not_found" in res.output
    res = invoke("create", "--store", store, "--no-audit")
    assert res.exit_code == 2
    res = invoke("create", "--models", "m", "--expires", "soon", "--store", store, "--no-audit")
    assert res.exit_code == 2
    res = invoke("list", "--store", "mysql://x")
    assert res.exit_code == 2 and "keystore_config_invalid" in res.output


@pytest.mark.parametrize(
    ("text", "seconds"), [("30d", 2592000), ("1h30m", 5400), ("45s", 45), ("2w", 1209600)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_cli_created_key_serves_and_revocation_reaches_gateway_serve(
    audited: tuple[Path, str], serve_asgi: Any, tmp_path: Path
) -> None:
    """The whole path: `gateway serve` with audit + keystore in one SQLite file, keys from the
    CLI, the official SDK as client."""
    import os
    import socket
    import time

    import httpx
    import openai

    from tests.gateway.helpers import start_sim

    cfg_path, _ = audited
    sim = start_sim(serve_asgi)
    cfg = yaml.safe_load(cfg_path.read_text())
    for model in cfg["models"]:
        model["replicas"] = [{"url": sim.url}]
    cfg["keystore"] = {"refresh_s": 0.3}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg["listen"] = {"host": "127.0.0.1", "port": port}
    cfg_path.write_text(yaml.safe_dump(cfg))
    res = invoke(
        "create",
        "--team",
        "a",
        "--models",
        "llama-3.1-8b",
        "--id",
        "live",
        "--config",
        str(cfg_path),
        "--json",
    )
    assert res.exit_code == 0, res.output
    token = json.loads(res.output.strip().splitlines()[-1])["key"]
    proc = subprocess.Popen(
        [*GATEWAY, "serve", "--config", str(cfg_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    client = openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.1)
        msgs: Any = [{"role": "user", "content": "hi"}]
        assert client.chat.completions.create(model="llama-3.1-8b", messages=msgs).choices
        res = invoke("revoke", "live", "--config", str(cfg_path))
        assert res.exit_code == 0, res.output
        t0 = time.monotonic()
        while True:
            try:
                client.chat.completions.create(model="llama-3.1-8b", messages=msgs)
            except openai.AuthenticationError:
                break
            assert time.monotonic() - t0 < 5, "revocation did not reach the gateway"
            time.sleep(0.05)
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr:
            proc.stderr.close()
