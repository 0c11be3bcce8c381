"""Running-gateway checks against a real ``gateway serve`` (subprocess) in front of vllm_sim.

The gateway runs with the egress guard, the audit log (SQLite) and the admin port; the
pre-flight reads ``GET /status`` and the audit store. Planted violations: the guard in monitor
mode, a stale checkpoint. Also the evidence pack: signed, verifiable (our verifier and an
openssl recipe), tamper-evident, and free of the planted secrets.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.audit import Signer, generate_key_file, write_key_pair
from gateway.cli import main
from gateway.preflight import Criteria, Inputs, run_preflight
from gateway.preflight.checks_audit import check_checkpoint
from tests.conftest import ServerThread, free_port
from tests.gateway.helpers import SERVED
from tests.gateway.preflight.conftest import REPO, SocketRecorder
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

KEY = "sg-preflight-client-key"
BACKEND_SECRET = "sk-backend-PLANTED-3f9a1c77"  # noqa: S105 - planted to prove it never leaks
FILE_SECRET = "sk-file-PLANTED-8d2e6b10"  # noqa: S105
CRITERIA = Criteria(regions=("eu-central-1",), retention_days=200)


@dataclass
class Running:
    config: Path
    admin_url: str
    public_key: Path
    signing_key: Path
    proc: subprocess.Popen[bytes]


def _status(admin_url: str) -> dict[str, Any] | None:
    try:
        resp = httpx.get(admin_url + "/status", timeout=2)
    except httpx.HTTPError:
        return None
    return dict(resp.json()) if resp.status_code == 200 else None


def _start(tmp: Path, sim_url: str, sim_port: int, guard: str) -> Running:
    policy = tmp / "policy.yaml"
    policy.write_text(
        "version: 1\ndata_classes: [public, internal]\ndestinations:\n"
        f"  - {{id: sim, host: 127.0.0.1, port: {sim_port}, region: eu-central-1, "
        "jurisdiction: EU, operator: acme}\n"
        "rules:\n  - {id: team-a-to-sim, principals: {teams: [a]}, destinations: [sim]}\n")
    (tmp / "backend.key").write_text(FILE_SECRET)
    key, pub = write_key_pair(Signer.generate(), tmp / "audit.key")
    admin_port, port = free_port(), free_port()
    cfg = {
        "listen": {"host": "127.0.0.1", "port": port},
        "models": [
            {"name": "m", "served_model_name": SERVED, "replicas": [
                {"url": sim_url, "destination": "sim", "api_key_env": "SG_PF_BACKEND_KEY"}]},
            {"name": "m2", "served_model_name": SERVED, "replicas": [
                {"url": sim_url, "destination": "sim",
                 "api_key_file": str(tmp / "backend.key")}]},
        ],
        "keys": [{"id": "a", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                  "models": ["m", "m2"], "team": "a"}],
        "health": {"active": False}, "logging": {"access_log": False},
        "drain": {"delay_s": 0},  # no load balancer in front: a stop need not wait 5 s
        "policy": {"file": str(policy), "guard": guard},
        "audit": {"store": f"sqlite://{tmp / 'audit.db'}", "signing_key_file": str(key),
                  "pseudonym_key_file": str(generate_key_file(tmp / "pseudonym.key")),
                  "replica_id": "pf", "checkpoint_every_s": 0.2, "heartbeat_s": 30},
        "telemetry": {"admin": {"host": "127.0.0.1", "port": admin_port}},
    }
    config = tmp / "gateway.yaml"
    config.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(REPO), "SG_PF_BACKEND_KEY": BACKEND_SECRET}
    log = tmp / "gateway.log"  # a file, not a pipe: a full pipe would stall the gateway
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config",
                                 str(config)], cwd=REPO, env=env, stderr=err,
                                stdout=subprocess.DEVNULL)
    try:
        return _wait(proc, config, admin_port, port, log, pub, key)
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise


def _wait(proc: subprocess.Popen[bytes], config: Path, admin_port: int, port: int, log: Path,
          pub: Path, key: Path) -> Running:
    admin = f"http://127.0.0.1:{admin_port}"
    deadline = time.monotonic() + 60
    while _status(admin) is None:
        assert proc.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, "gateway did not start: " + log.read_text()[-2000:]
        time.sleep(0.1)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0,
                           timeout=20)
    assert client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2).choices
    client.close()
    while not ((_status(admin) or {}).get("audit") or {}).get("last_checkpoint"):
        assert time.monotonic() < deadline, "no checkpoint was signed"
        time.sleep(0.1)
    return Running(config, admin, pub, key, proc)


@contextmanager
def _serving(tmp: Path, guard: str) -> Iterator[Running]:
    sim = ServerThread(create_sim(SimConfig(models=[SERVED]))).start()
    try:
        running = _start(tmp, sim.url, sim.port, guard)
        try:
            yield running
        finally:
            running.proc.send_signal(signal.SIGTERM)
            running.proc.wait(20)
    finally:
        sim.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """One gateway with the guard in enforce mode for the module (start-up is slow on 2 cores)."""
    with _serving(tmp_path_factory.mktemp("enforce"), "enforce") as running:
        yield running


@pytest.fixture
def monitoring_gateway(tmp_path: Path) -> Iterator[Running]:
    with _serving(tmp_path, "monitor") as running:
        yield running


def _inputs(g: Running) -> Inputs:
    return Inputs(config=g.config, admin_url=g.admin_url, audit_public_key=g.public_key)


def test_running_gateway_with_guard_enforce_passes(gateway: Running,
                                                   sockets: SocketRecorder) -> None:
    assert "SG_PF_BACKEND_KEY" not in os.environ  # the pre-flight needs no backend secret
    sockets.active = True
    report, facts = run_preflight(_inputs(gateway), CRITERIA)
    sockets.active = False
    checks = {c.id: c for c in report.checks}
    for cid in ("gateway.guard", "audit.verify", "audit.checkpoint-fresh", "policy.destinations",
                "policy.unsafe-off", "audit.retention"):
        assert checks[cid].status == "pass", (cid, checks[cid].verdict)
    assert report.exit_code == 0
    status = facts.status or {}
    assert status["guard"] == {"mode": "enforce", "installed": True, "self_test": "passed"}
    assert status["loop"].startswith("asyncio.")
    assert status["policy"]["revision"] == facts.policy.revision
    assert checks["audit.checkpoint-fresh"].evidence["signature"] == "verified"
    admin_port = int(gateway.admin_url.rsplit(":", 1)[1])
    assert {tuple(a[:2]) for a in sockets.connects} == {("127.0.0.1", admin_port)}


def test_guard_in_monitor_mode_fails(monitoring_gateway: Running) -> None:
    report, _ = run_preflight(Inputs(admin_url=monitoring_gateway.admin_url), CRITERIA)
    guard = next(c for c in report.checks if c.id == "gateway.guard")
    assert guard.status == "fail"
    assert guard.verdict == "guard mode is 'monitor', not 'enforce'"
    assert report.exit_code == 1


def test_stale_checkpoint_fails(gateway: Running) -> None:
    _, facts = run_preflight(Inputs(admin_url=gateway.admin_url,
                                    audit_public_key=gateway.public_key), CRITERIA)
    ts_s = facts.status["audit"]["last_checkpoint"]["ts_us"] / 1e6  # type: ignore[index]
    fresh = check_checkpoint(facts, now_s=ts_s + 59)
    stale = check_checkpoint(facts, now_s=ts_s + 61)  # heartbeat 30 s: bound 60 s
    assert fresh.status == "pass"
    assert stale.status == "fail"
    assert stale.verdict == "newest checkpoint is 61 s old (bound 60 s = 2 x heartbeat)"


def _pae_one_liner(envelope: Path) -> bytes:
    """The documented recipe's PAE step, run as its own process (independent of our code)."""
    code = ('import json,base64,sys;e=json.load(open(sys.argv[1]));t=e["payloadType"].encode();'
            'p=base64.b64decode(e["payload"]);'
            'sys.stdout.buffer.write(b"DSSEv1 %d %s %d %s"%(len(t),t,len(p),p))')
    return subprocess.run([sys.executable, "-c", code, str(envelope)], capture_output=True,
                          check=True).stdout


def test_evidence_pack_verifies_offline_and_holds_no_secret(
        gateway: Running, operator_key: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    priv, pub = operator_key
    out = tmp_path / "pack"
    code = main(["preflight", "--config", str(gateway.config), "--admin-url",
                 gateway.admin_url, "--audit-public-key", str(gateway.public_key),
                 "--region", "eu-central-1", "--retention-days", "200",
                 "--out", str(out), "--sign-key", str(priv)])
    assert code == 0, capsys.readouterr()
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == ["envelope.dsse.json", "evidence/checkpoint.txt", "evidence/config.json",
                     "evidence/policy.json", "evidence/status.json", "report.json",
                     "report.md", "signer.pub"]
    assert (out / "evidence/checkpoint.txt").read_text().startswith("pf/")
    config = json.loads((out / "evidence/config.json").read_text())
    assert config["file_sha256"] == "sha256:" + hashlib.sha256(
        gateway.config.read_bytes()).hexdigest()
    assert config["running_config_revision"].startswith("sha256:")
    # secrets never appear: backend key (env), key file content, audit and operator keys
    blob = b"".join(p.read_bytes() for p in out.rglob("*") if p.is_file())
    for secret in (BACKEND_SECRET, FILE_SECRET, gateway.signing_key.read_text().strip(),
                   priv.read_text()):
        assert secret.encode() not in blob
        assert base64.b64encode(secret.encode())[:24] not in blob
    capsys.readouterr()
    assert main(["preflight", "verify", str(out), "--key", str(pub), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    # the documented recipe: PAE by a one-liner, Ed25519 by openssl, digests by sha256sum
    env = json.loads((out / "envelope.dsse.json").read_text())
    payload = base64.b64decode(env["payload"])
    assert _pae_one_liner(out / "envelope.dsse.json") == (
        b"DSSEv1 28 application/vnd.in-toto+json " + str(len(payload)).encode() + b" " + payload)
    (tmp_path / "pae.bin").write_bytes(_pae_one_liner(out / "envelope.dsse.json"))
    (tmp_path / "sig.bin").write_bytes(base64.b64decode(env["signatures"][0]["sig"]))
    ossl = subprocess.run(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(pub),
                           "-rawin", "-in", str(tmp_path / "pae.bin"), "-sigfile",
                           str(tmp_path / "sig.bin")], capture_output=True, text=True)
    assert ossl.returncode == 0 and "Signature Verified Successfully" in ossl.stdout, ossl
    sums = "".join(f"{s['digest']['sha256']}  {s['name']}\n"
                   for s in json.loads(payload)["subject"])
    check = subprocess.run(["sha256sum", "-c", "-"], input=sums, cwd=out, capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # a tampered evidence file fails both verifiers
    status = out / "evidence/status.json"
    status.write_text(status.read_text().replace('"enforce"', '"monitor"'))
    assert main(["preflight", "verify", str(out), "--key", str(pub), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["problems"] == ["evidence/status.json: content differs from the signed digest"]
    check = subprocess.run(["sha256sum", "-c", "-"], input=sums, cwd=out, capture_output=True,
                           text=True)
    assert check.returncode == 1 and "evidence/status.json: FAILED" in check.stdout


def test_tampered_audit_record_fails_verify(gateway: Running, tmp_path: Path) -> None:
    cfg = yaml.safe_load(gateway.config.read_text())
    db = Path(cfg["audit"]["store"].removeprefix("sqlite://"))
    copy = tmp_path / "audit.db"
    with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)  # a consistent copy while the gateway keeps writing
    cfg["audit"]["store"] = f"sqlite://{copy}"
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(cfg))
    inputs = Inputs(config=config, audit_public_key=gateway.public_key)
    report, _ = run_preflight(inputs, CRITERIA)
    assert next(c for c in report.checks if c.id == "audit.verify").status == "pass"
    with sqlite3.connect(copy) as conn:
        body = conn.execute("SELECT body FROM audit_records WHERE seq = 1").fetchone()[0]
        changed = bytes(body).replace(b'"type"', b'"tYpe"', 1)
        assert changed != bytes(body)
        conn.execute("UPDATE audit_records SET body = ? WHERE seq = 1", (changed,))
    report, _ = run_preflight(inputs, CRITERIA)
    check = next(c for c in report.checks if c.id == "audit.verify")
    assert check.status == "fail", check.verdict
    assert report.exit_code == 1
