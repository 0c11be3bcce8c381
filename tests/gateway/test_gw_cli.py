"""The ``gateway`` CLI: check-config, keys, serve (real subprocess), and the make-run demo."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from gateway.cli import main
from gateway.config.loader import parse
from tests.conftest import free_port
from tests.gateway.helpers import KEY_A, Sim, config

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gateway.yaml"


def test_check_config_ok(capsys: pytest.CaptureFixture[str],
                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KEY", "x")
    assert main(["check-config", "--config", str(EXAMPLE)]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["check-config", "--json", "--config", str(EXAMPLE)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ok"] and summary["models"]["llama-3.1-8b"]["aliases"] == ["default"]


def test_check_config_invalid_names_key(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(["http://127.0.0.1:1"])
    cfg["models"][0]["replicas"][0]["url"] = "10.0.0.1:8000"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["check-config", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert "models[0].replicas[0].url: must be an http:// or https:// URL" in err
    assert main(["check-config", "--config", str(tmp_path / "missing.yaml")]) == 2


def test_check_config_says_why_a_file_cannot_be_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """A missing config file is reported as missing (not as "not a file"), a directory as a
    directory, both exit 2 (unreadable), in the text and the ``--json`` output alike.

    Unreadable is an I/O error, not a problem at a line of the config: the shared error line
    with its code and what to do (it was ``FILE: (top level): cannot read ...``, no hint)."""
    missing = tmp_path / "missing.yaml"
    assert main(["check-config", "--config", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"gateway: error [io_error]: {missing}: cannot read config file: No such file or "
        "directory (hint: check the path given with --config (or SG_CONFIG) and its "
        "permissions)\n")
    assert main(["check-config", "--json", "--config", str(tmp_path)]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["error"]["code"] == "io_error"
    assert doc["problems"][0]["problem"] == "cannot read config file: Is a directory"


def test_keys_new_prints_key_once_and_config_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "new", "--id", "team-x", "--model", "llama-3.1-8b",
                 "--team", "x"]) == 0
    out = capsys.readouterr().out
    key = re.search(r"key:\s+(sg-\S+)", out)
    line = re.search(r"^\s*- (\{id: team-x.*\})$", out, re.M)
    assert key and line
    entry = yaml.safe_load(line.group(1))
    cfg = config(["http://127.0.0.1:1"])
    cfg["keys"] = [entry]
    s = parse(cfg, {"VLLM_KEY": "k"})
    from gateway.auth import KeyRing

    assert KeyRing(s.keys).authenticate(key.group(1)).team == "x"
    assert main(["keys", "new", "--id", "y", "--model", "*", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["key"] != key.group(1) and data["models"] == ["*"]


def test_keys_new_asks_for_the_models_and_never_grants_every_model_by_default(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without ``--model`` a new key got every model (``models: ['*']``) while ``keys
    create`` refuses that: least privilege means a key for every model is asked for
    (``--model '*'``), and the help says how."""
    assert main(["keys", "new", "--id", "y"]) == 2
    captured = capsys.readouterr()
    assert "--model" in captured.err and "key:" not in captured.out
    assert main(["keys", "new", "--help"]) == 0
    assert "'*' for every model" in " ".join(capsys.readouterr().out.split())


def test_audit_verify_help_says_what_ok_means_without_a_key(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``gateway audit verify --store URL`` without a key prints OK (with the warning
    signatures_not_checked); its help spoke only of checkpoints "signed by a trusted key",
    so a reader took that OK for a signature check."""
    assert main(["audit", "verify", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "no signature is checked" in text and "signatures_not_checked" in text, text


def test_serve_invalid_config_fails_at_start(tmp_path: Path) -> None:
    cfg = config(["http://127.0.0.1:1"])
    cfg["timeouts"]["idle_s"] = -1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "VLLM_KEY": "k"},
    )
    assert proc.returncode == 2
    assert "timeouts.idle_s: Input should be greater than 0" in proc.stderr


def test_serve_runs_and_logs_json_access_lines(tmp_path: Path, sim: Sim) -> None:
    port = free_port()
    cfg = config([sim.url])
    cfg["listen"]["port"] = port
    cfg["logging"] = {"access_log": True, "format": "json"}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "VLLM_KEY": "backend-key"},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0) as client:
            r = client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": "secret prompt text"}])
            assert r.choices[0].message.content
            assert [m.id for m in client.models.list()] == ["llama-3.1-8b"]
    finally:
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    # Ctrl-C drains, then exits 130 (never "success"); SIGTERM's drain exits 0.
    assert proc.returncode == 130, stderr[-2000:]
    assert stderr.splitlines()[-1].startswith(
        "gateway: error [interrupted]: interrupted by SIGINT; the gateway stopped (after its "
        "drain, or at once on a second signal)")
    access = [json.loads(line) for line in stderr.splitlines()
              if line.startswith("{") and '"type":"access"' in line]
    assert len(access) == 2  # chat + models; health probes are not logged
    assert access[1]["path"] == "/v1/models" and access[1]["status"] == 200
    entry = access[0]
    assert entry["key_id"] == "team-a" and entry["status"] == 200 and entry["model"] == (
        "llama-3.1-8b")
    assert entry["backend"] == sim.url and entry["output_tokens"] == 16
    assert {"request_id", "latency_ms", "input_tokens"} <= set(entry)
    for secret in (KEY_A, "backend-key", "secret prompt text", r.choices[0].message.content):
        assert secret not in stderr


def test_demo_examples_work_as_printed(tmp_path: Path) -> None:
    """``make run``: the printed curl and openai SDK examples work verbatim."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.demo"], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    out: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        text = "".join(out)
        base = re.search(r"^gateway\s+(http://\S+)", text, re.M)
        assert base, text
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(base.group(1) + "/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        curls = re.findall(r"^  curl .*?(?<!\\)\n(?!    )", text, re.M | re.S)
        assert len(curls) == 2
        for cmd in curls:
            res = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30)
            assert res.returncode == 0 and ("chat.completion" in res.stdout), res
        sdk = re.search(r"^(\.venv/bin/python - <<'PY'\n.*?^PY\n)", text, re.M | re.S)
        assert sdk
        res = subprocess.run(["bash", "-c", sdk.group(1)], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert "completion_tokens=16" in res.stdout and "日本語" in res.stdout
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == 0


