"""Continuous pre-flight in a real ``gateway serve``: rounds, /status, /metrics, signed packs.

The gateway runs with the egress guard, the audit log (SQLite), the admin port and a
``preflight:`` section with a short interval. The test reads ``GET /status`` and ``/metrics``
as Prometheus would, verifies the evidence pack the process wrote with ``gateway preflight
verify``, then tampers with a sealed audit record in the store the gateway is writing: the next
round fails ``audit.verify``, the metric flips and a second pack (the change) is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client.parser import text_string_to_metric_families

from gateway.audit import Signer, generate_key_file, write_key_pair
from gateway.cli import main
from tests.conftest import free_port
from tests.gateway.preflight.conftest import REPO


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None


def _checks(metrics_text: str) -> dict[tuple[str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(metrics_text):
        if fam.name == "sg_preflight_check":
            for s in fam.samples:
                out[(s.labels["check"], s.labels["status"])] = s.value
    return out


def _oscal_state(pack: Path, check: str) -> str:
    """The finding's state in the pack's OSCAL results, read by compliance-trestle's models."""
    from trestle.oscal.assessment_results import AssessmentResults

    results = AssessmentResults.oscal_read(pack / "oscal" / "assessment-results.json")
    finding = next(f for f in results.results[0].findings or () if f.title == check)
    return str(finding.target.status.state.value)


def _last_run(admin: str) -> float:
    resp = _get(admin + "/metrics")
    if resp is None:
        return 0.0
    for fam in text_string_to_metric_families(resp.text):
        if fam.name == "sg_preflight_last_run_timestamp_seconds":
            return float(fam.samples[0].value)
    return 0.0


def _wait_rounds(admin: str, proc: subprocess.Popen[bytes], log: Path, n: int) -> None:
    """Wait until ``n`` more rounds ended (bounded)."""
    seen, last = 0, _last_run(admin)
    deadline = time.monotonic() + 60
    while seen < n:
        assert proc.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, "no continuous pre-flight round: " + \
            log.read_text()[-2000:]
        now = _last_run(admin)
        if now > last:
            seen, last = seen + 1, now
        time.sleep(0.05)


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[dict[str, Any]]:
    upstream = free_port()
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "version: 1\ndata_classes: [public, internal]\ndestinations:\n"
        f"  - {{id: sim, host: 127.0.0.1, port: {upstream}, region: eu-central-1, "
        "jurisdiction: EU, operator: acme}\n"
        "rules:\n  - {id: r, principals: {teams: [a]}, destinations: [sim]}\n")
    key, pub = write_key_pair(Signer.generate(), tmp_path / "audit.key")
    operator = Ed25519PrivateKey.generate()
    (tmp_path / "operator.pem").write_bytes(operator.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (tmp_path / "operator.pub").write_bytes(operator.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    admin_port, port = free_port(), free_port()
    cfg = {
        "listen": {"host": "127.0.0.1", "port": port},
        "models": [{"name": "m", "replicas": [{"url": f"http://127.0.0.1:{upstream}",
                                               "destination": "sim"}]}],
        "keys": [{"id": "a", "sha256": hashlib.sha256(b"k").hexdigest(), "models": ["m"],
                  "team": "a"}],
        "health": {"active": False}, "logging": {"access_log": False},
        "drain": {"delay_s": 0},  # no load balancer in front: a stop need not wait 5 s
        "policy": {"file": str(policy), "guard": "enforce"},
        "audit": {"store": f"sqlite://{tmp_path / 'audit.db'}", "signing_key_file": str(key),
                  "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key")),
                  "replica_id": "pf", "checkpoint_every_s": 0.2, "heartbeat_s": 30},
        "telemetry": {"admin": {"host": "127.0.0.1", "port": admin_port}},
        "preflight": {"interval_s": 0.3, "regions": ["eu-central-1"], "retention_days": 200,
                      "audit_public_key": str(pub), "evidence_dir": "evidence",
                      "sign_key_file": "operator.pem"},
    }
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(cfg))
    log = tmp_path / "gateway.log"  # a file, not a pipe: a full pipe would stall the gateway
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config",
                                 str(config)], cwd=REPO, env=env, stderr=err,
                                stdout=subprocess.DEVNULL)
    try:
        yield {"admin": f"http://127.0.0.1:{admin_port}", "proc": proc, "log": log,
               "dir": tmp_path, "db": tmp_path / "audit.db"}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_continuous_preflight_reports_signs_and_flips_on_tampering(
        serving: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    admin, proc, log = serving["admin"], serving["proc"], serving["log"]
    _wait_rounds(admin, proc, log, 3)
    status = httpx.get(admin + "/status", timeout=5).json()["preflight"]
    assert status["result"] == "pass", status
    checks = {k: v["status"] for k, v in status["checks"].items()}
    assert checks == {"policy.destinations": "pass", "policy.no-allow-all": "pass",
                      "policy.unsafe-off": "pass", "gateway.guard": "pass",
                      "audit.verify": "pass", "audit.checkpoint-fresh": "pass",
                      "audit.retention": "pass", "telemetry.destinations": "pass",
                      # not required, no mcp: section
                      "identity.configured": "skip", "mcp.destinations": "skip"}, status
    metrics = _checks(httpx.get(admin + "/metrics", timeout=5).text)
    assert metrics[("gateway.guard", "pass")] == 1.0
    assert metrics[("audit.verify", "fail")] == 0.0
    # one pack for several rounds with the same results, and it verifies
    packs = sorted((serving["dir"] / "evidence").iterdir())
    assert len(packs) == 1, packs
    capsys.readouterr()
    assert main(["preflight", "verify", str(packs[0]), "--key",
                 str(serving["dir"] / "operator.pub"), "--json"]) == 0
    verified = json.loads(capsys.readouterr().out)
    assert {"oscal/assessment-results.json", "oscal/component-definition.json",
            "evidence/status.json", "evidence/checkpoint.txt"} <= set(verified["subjects"])
    assert verified["predicate"]["checks"]["audit.verify"] == "pass"
    assert _oscal_state(packs[0], "audit.verify") == "satisfied"

    # tamper with a sealed record of the store the gateway is writing to
    with sqlite3.connect(serving["db"], timeout=10) as conn:
        body = conn.execute("SELECT body FROM audit_records WHERE seq = 0").fetchone()[0]
        conn.execute("UPDATE audit_records SET body = ? WHERE seq = 0",
                     (bytes(body).replace(b'"chain.started"', b'"chain.stArted"'),))
    deadline = time.monotonic() + 60
    while _checks(httpx.get(admin + "/metrics", timeout=5).text).get(
            ("audit.verify", "fail")) != 1.0:
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.1)
    status = httpx.get(admin + "/status", timeout=5).json()["preflight"]
    assert status["result"] == "fail"
    assert status["checks"]["audit.verify"]["status"] == "fail"
    _wait_rounds(admin, proc, log, 1)
    packs = sorted((serving["dir"] / "evidence").iterdir())
    assert len(packs) == 2, packs  # the change was sealed in a new pack
    capsys.readouterr()
    # The pack is genuine and says FAIL: verify exits 1 for it unless told to accept a FAIL.
    assert main(["preflight", "verify", str(packs[1]), "--key",
                 str(serving["dir"] / "operator.pub")]) == 1
    capsys.readouterr()
    assert main(["preflight", "verify", str(packs[1]), "--key",
                 str(serving["dir"] / "operator.pub"), "--json", "--allow-fail"]) == 0
    assert json.loads(capsys.readouterr().out)["predicate"]["checks"]["audit.verify"] == "fail"
    assert _oscal_state(packs[1], "audit.verify") == "not-satisfied"
    assert "continuous pre-flight: audit.verify failed" in log.read_text()


def test_pod_merge_keeps_a_failing_workers_check_at_1() -> None:
    """With ``serve --workers N`` the supervisor merges the workers' /metrics: a summed gauge
    would report 2 for two failing workers and hide a stalled one behind a live one."""
    from gateway.telemetry.pod import merge_expositions

    def worker(fail: float, last_run: float) -> str:
        return ("# TYPE sg_preflight_check gauge\n"
                f'sg_preflight_check{{check="audit.verify",status="fail"}} {fail}\n'
                f'sg_preflight_check{{check="audit.verify",status="pass"}} {1 - fail}\n'
                "# TYPE sg_preflight_last_run_timestamp_seconds gauge\n"
                f"sg_preflight_last_run_timestamp_seconds {last_run}\n")

    merged = {(f.name, tuple(sorted(s.labels.items()))): s.value
              for f in merge_expositions([worker(1, 100.0), worker(1, 40.0)])
              for s in f.samples}
    assert merged[("sg_preflight_check", (("check", "audit.verify"), ("status", "fail")))] == 1
    assert merged[("sg_preflight_last_run_timestamp_seconds", ())] == 40.0


def test_a_pack_per_day_and_per_change(tmp_path: Path) -> None:
    """Same statuses on the same UTC day: no new pack; a new day or a changed status: one."""
    import dataclasses

    from gateway.preflight import Criteria, Inputs, run_preflight
    from gateway.preflight.continuous import ContinuousPreflight
    from gateway.preflight.live_settings import ContinuousSettings
    from tests.gateway.preflight.conftest import SCENARIO_POLICY

    key = Ed25519PrivateKey.generate()
    (tmp_path / "op.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    settings = ContinuousSettings(evidence_dir=tmp_path / "ev", sign_key_file=tmp_path / "op.pem")

    async def no_status() -> dict[str, Any]:
        return {}

    live = ContinuousPreflight(settings, None, None, no_status)
    report, facts = run_preflight(Inputs(policy=SCENARIO_POLICY),
                                  Criteria(regions=("eu-central-1",)))
    day1 = dataclasses.replace(report, generated_at="2026-12-01T10:00:00Z")
    first = live.write_pack_if_due(day1, facts)
    assert first is not None and first.name == "20261201T100000Z-gateway"
    later = dataclasses.replace(report, generated_at="2026-12-01T18:00:00Z")
    assert live.write_pack_if_due(later, facts) is None
    next_day = dataclasses.replace(report, generated_at="2026-12-02T00:00:05Z")
    assert live.write_pack_if_due(next_day, facts) is not None
    failed, _ = run_preflight(Inputs(policy=SCENARIO_POLICY), Criteria(regions=("us-east-1",)))
    changed = dataclasses.replace(failed, generated_at="2026-12-02T00:10:00Z")
    assert live.write_pack_if_due(changed, facts) is not None
    assert len(list((tmp_path / "ev").iterdir())) == 3 == live.packs_written


def test_a_check_that_raises_fails_alone() -> None:
    """A registered check (identity, MCP, ...) that raises is a failed check; the rest run."""
    from gateway.preflight import Criteria, Inputs, collect
    from gateway.preflight.continuous import LiveChecks
    from tests.gateway.preflight.conftest import SCENARIO_POLICY

    def check_identity_provider(facts: Any) -> Any:
        raise OSError("issuer metadata unreadable")

    checks = LiveChecks()
    checks.register(check_identity_provider)
    facts = collect(Inputs(policy=SCENARIO_POLICY), Criteria(regions=("eu-central-1",)))
    report = checks.run(facts)
    by_id = {c.id: c for c in report.checks}
    assert by_id["policy.destinations"].status == "pass"
    broken = by_id["check.identity_provider"]
    assert broken.status == "fail" and "OSError: issuer metadata unreadable" in broken.verdict
    assert report.exit_code == 1


@pytest.mark.parametrize(("section", "problem"), [
    ("preflight: {interval_s: 10}\n",
     ":2: preflight: the continuous pre-flight reports on the admin port"),
    ("telemetry: {admin: {port: 0}}\npreflight: {evidence_dir: ev}\n",
     ":3: preflight: evidence_dir needs sign_key_file"),
])
def test_check_config_refuses_a_preflight_that_cannot_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, problem: str) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text('models: [{name: m, replicas: [{url: "http://127.0.0.1:9"}]}]\n' + section)
    capsys.readouterr()
    assert main(["check-config", "--config", str(config)]) == 1
    assert problem in capsys.readouterr().err


@pytest.mark.parametrize(("section", "problem"), [
    # the docs' example names audit-key.pub; `gateway audit keygen --out audit.key` writes
    # audit.key.pub: serve ran and every round failed audit.verify and checkpoint-fresh
    ("telemetry: {admin: {port: 0}}\npreflight: {audit_public_key: audit-key.pub}\n",
     "preflight.audit_public_key: cannot read public key"),
    ("telemetry: {admin: {port: 0}}\npreflight: {audit_public_key: op.pem}\n",
     "preflight.audit_public_key:"),
    ("telemetry: {admin: {port: 0}}\npreflight: {evidence_dir: ev, sign_key_file: none.pem}\n",
     "preflight.sign_key_file: cannot load signing key"),
    ("telemetry: {admin: {port: 0}}\npreflight: {evidence_dir: ev, sign_key_file: op.pub}\n",
     "preflight.sign_key_file:"),
    ("telemetry: {admin: {port: 0}}\npreflight: {evidence_dir: gateway.yaml, "
     "sign_key_file: op.pem}\n", "preflight.evidence_dir: "),
])
def test_check_config_reads_the_preflight_key_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, problem: str) -> None:
    """A key the rounds cannot load is a config error at start, naming the key."""
    key = Ed25519PrivateKey.generate()
    (tmp_path / "op.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (tmp_path / "op.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    config = tmp_path / "gateway.yaml"
    config.write_text('models: [{name: m, replicas: [{url: "http://127.0.0.1:9"}]}]\n' + section)
    capsys.readouterr()
    assert main(["check-config", "--config", str(config)]) == 1
    assert problem in capsys.readouterr().err
    # the same section with readable files is fine
    good = section.replace("audit-key.pub", "op.pub").replace("audit_public_key: op.pem",
                                                              "audit_public_key: op.pub")
    good = good.replace("none.pem", "op.pem").replace("sign_key_file: op.pub",
                                                      "sign_key_file: op.pem")
    good = good.replace("evidence_dir: gateway.yaml", "evidence_dir: ev")
    config.write_text('models: [{name: m, replicas: [{url: "http://127.0.0.1:9"}]}]\n' + good)
    capsys.readouterr()
    assert main(["check-config", "--config", str(config)]) == 0, capsys.readouterr().err


def test_shutdown_waits_for_the_round_in_its_thread(tmp_path: Path) -> None:
    """A round runs in a worker thread; shutdown returns only once that thread is done, so no
    check reads the audit store (or writes a pack) after the store was closed."""
    import asyncio
    import threading

    from gateway.preflight.continuous import ContinuousPreflight, LiveChecks
    from gateway.preflight.live_settings import ContinuousSettings
    from gateway.preflight.report import CheckResult

    entered, release, finished = threading.Event(), threading.Event(), threading.Event()

    def check_slow_store(facts: Any) -> CheckResult:
        entered.set()
        release.wait(30)
        finished.set()
        return CheckResult("slow.store", "t", "pass", "read")

    async def no_status() -> dict[str, Any]:
        return {}

    async def main_() -> None:
        live = ContinuousPreflight(ContinuousSettings(interval_s=0.05), None, None, no_status,
                                   checks=LiveChecks([check_slow_store]))
        await live.startup()
        assert await asyncio.to_thread(entered.wait, 30)
        threading.Timer(0.3, release.set).start()
        await live.shutdown()
        assert finished.is_set(), "shutdown returned while the round's thread still ran"

    asyncio.run(main_())


def test_pod_status_shows_the_worst_workers_preflight() -> None:
    """With ``serve --workers N`` the pod's ``/status`` answered the first worker's
    ``preflight`` object: a check failing in another worker read as ``pass``."""
    from gateway.preflight.status import merge_preflight

    def summary(at: str, guard: str, fresh: str) -> dict[str, Any]:
        return {"generated_at": at, "result": "fail" if "fail" in (guard, fresh) else "pass",
                "interval_s": 300.0,
                "checks": {"gateway.guard": {"status": guard, "verdict": f"guard {guard}"},
                           "audit.checkpoint-fresh": {"status": fresh,
                                                      "verdict": f"fresh {fresh}"}}}

    merged = merge_preflight([summary("2026-12-04T10:00:05Z", "pass", "pass"),
                              summary("2026-12-04T10:00:01Z", "fail", "pass"), None])
    assert merged is not None and merged["result"] == "fail"
    assert merged["checks"]["gateway.guard"] == {"status": "fail", "verdict": "guard fail",
                                                 "worker": 1}
    assert merged["checks"]["audit.checkpoint-fresh"]["status"] == "pass"
    assert merged["generated_at"] == "2026-12-04T10:00:01Z"  # the oldest round
    assert merged["workers_reporting"] == 2
    assert merge_preflight([None, None]) is None
