"""``gateway serve --workers 2``: two real worker processes on one port behind a supervisor.

Each worker has its own audit chain (its pid in ``chain.started``), its own process guard
(self-tested), shares the quota state in Redis; the admin port reports the whole pod; SIGTERM
drains both workers and exits 0; a killed worker is restarted; memory-backed quotas are refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import free_port
from tests.conftest import wait_until as _wait
from tests.gateway.helpers import SERVED, Sim, Stream, start_sim

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/0"
KEY_BULK = "sg-workers-bulk"
KEY_LIMITED = "sg-workers-limited"
LIMIT = 10  # requests per minute of the limited key, for the whole pod


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class Pod:
    proc: subprocess.Popen[str]
    url: str
    admin: str
    config: Path

    def get(self, url: str) -> httpx.Response | None:
        try:
            return httpx.get(url, timeout=5)
        except httpx.TransportError:
            return None

    def status(self) -> dict[str, Any] | None:
        r = self.get(self.admin + "/status")
        return r.json() if r is not None and r.status_code == 200 else None

    def worker_pids(self) -> list[int]:
        st = self.status() or {}
        return sorted(w["pid"] for w in st.get("workers", []))

    def metrics(self) -> dict[str, Any]:
        r = self.get(self.admin + "/metrics")
        assert r is not None and r.status_code == 200
        return {f.name: f for f in text_string_to_metric_families(r.text)}


@pytest.fixture
def sim_url(serve_asgi: Callable[..., Any]) -> str:
    # Up to 1,000 tokens 20 ms apart: max_tokens=100 is a stream of about 2 s.
    return start_sim(serve_asgi, itl_s=0.02, tokens_per_response=1000).url


@pytest.fixture
def pod(tmp_path: Path, sim_url: str, redis_prefix: str) -> Iterator[Callable[..., Pod]]:
    from gateway.audit import Signer, generate_key_file, write_key_pair

    procs: list[subprocess.Popen[str]] = []

    def start(quotas: str = "redis", audit: bool = True, workers: int = 2,
              expect_start: bool = True, extra_destination: str = "",
              flow: dict[str, Any] | None = None) -> Pod:
        port, admin = free_port(), free_port()
        sim_port = int(sim_url.rsplit(":", 1)[1])
        policy = tmp_path / "policy.yaml"
        dest = "{id: %s, host: 127.0.0.1, port: %d, region: eu-de-1, jurisdiction: EU, " \
               "operator: acme}"
        policy.write_text(
            "version: 1\ndata_classes: [public]\ndestinations:\n"
            f"  - {dest % ('sim', sim_port)}\n  - {dest % ('redis', 6379)}\n"
            + extra_destination + "rules:\n  - {id: public-anywhere, classes: [public]}\n")
        cfg: dict[str, Any] = {
            "listen": {"host": "127.0.0.1", "port": port},
            "models": [{"name": "m", "served_model_name": SERVED,
                        "replicas": [{"url": sim_url, "destination": "sim"}]}],
            "keys": [{"id": kid, "sha256": _sha(key), "models": ["m"], "team": "t",
                      "data_class": "public"}
                     for kid, key in (("bulk", KEY_BULK), ("limited", KEY_LIMITED))],
            "health": {"active": False},
            "logging": {"access_log": False},
            "drain": {"delay_s": 0.5, "timeout_s": 30},
            "policy": {"file": str(policy), "guard": "enforce"},
            "telemetry": {"admin": {"host": "127.0.0.1", "port": admin}},
            "quotas": {"backend": quotas, "redis_url": REDIS_URL, "key_prefix": redis_prefix,
                       "keys": {"limited": {"requests_per_minute": LIMIT}}},
        }
        if flow is not None:
            cfg["flow_control"] = {"enabled": True, **flow}
        if audit:
            key, _ = write_key_pair(Signer.generate(), tmp_path / "audit.key")
            cfg["audit"] = {
                "store": f"sqlite://{tmp_path / 'audit.db'}", "signing_key_file": str(key),
                "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key")),
                "replica_id": "pod", "heartbeat_s": 5,
            }
        path = tmp_path / "gateway.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path),
             "--workers", str(workers)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            # no preexec_fn: the supervisor sets its own handlers for SIGTERM, SIGINT and SIGHUP
            # (ignored when started from nohup or a background job) and the workers theirs
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        procs.append(proc)
        p = Pod(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}", path)
        if expect_start:
            _wait(lambda: len(p.worker_pids()) == workers or proc.poll() is not None, 120,
                  "both workers to serve")
            assert proc.poll() is None, proc.communicate()[1][-3000:]
        return p

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _requests_by_chain(db: Path) -> tuple[dict[str, int], dict[str, int]]:
    """``({chain: pid of chain.started}, {chain: request records})`` of the audit store."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT chain, type, body FROM audit_records").fetchall()
    pids: dict[str, int] = {}
    requests: dict[str, int] = {}
    for chain, type_, body in rows:
        if type_ == "chain.started":
            pids[chain] = json.loads(body)["data"]["pid"]
        elif type_.startswith("request."):
            requests[chain] = requests.get(chain, 0) + 1
    return pids, requests


def _total(families: dict[str, Any], name: str, sample: str | None = None,
           **labels: str) -> float:
    fam = families[name]
    return float(sum(s.value for s in fam.samples if s.name == (sample or name)
                     and all(s.labels.get(k) == v for k, v in labels.items())))


def test_two_workers_serve_one_port_with_own_chains_shared_quota_and_one_metrics_view(
    pod: Callable[..., Pod], tmp_path: Path,
) -> None:
    p = pod()
    pids = p.worker_pids()
    assert len(set(pids)) == 2 and p.proc.pid not in pids
    status = p.status()
    assert status is not None
    # the process guard was installed and self-tested in each worker
    for w in status["workers"]:
        assert w["guard"] == {"mode": "enforce", "installed": True, "self_test": "passed"}
        assert w["loop"].startswith("asyncio.")
    assert status["guard"]["self_test"] == "passed"
    assert sorted(w["audit_replica"] for w in status["workers"]) == ["pod-w0", "pod-w1"]

    # concurrent streams, one connection each, until both workers have served some
    sent = 0
    db = tmp_path / "audit.db"
    for _ in range(10):
        batch = [Stream(p.url, KEY_BULK, model="m") for _ in range(16)]
        for st in batch:
            st.start()
        for st in batch:
            st.join(60)
            assert st.error is None and st.status == 200 and st.events[-1] == "[DONE]"
        sent += len(batch)
        chain_pids, served = _requests_by_chain(db)
        if len(served) == 2:
            break
    assert len(served) == 2, served
    assert sorted(chain_pids[c] for c in served) == pids  # each worker audits in its own chain

    # /metrics on the admin port: the pod's requests, summed over both workers
    families = p.metrics()
    assert _total(families, "sg_gateway_workers") == 2
    assert _total(families, "sg_gateway_requests", "sg_gateway_requests_total",
                  sg_key_id="bulk") == sent
    assert _total(families, "gen_ai_server_request_duration_seconds",
                  "gen_ai_server_request_duration_seconds_count", sg_key_id="bulk") == sent

    # the limited key: LIMIT per minute for the pod, whichever worker admits
    limited = [Stream(p.url, KEY_LIMITED, max_tokens=5, model="m") for _ in range(3 * LIMIT)]
    for st in limited:
        st.start()
    for st in limited:
        st.join(60)
    codes = sorted(st.status for st in limited)
    assert codes.count(200) == LIMIT and codes.count(429) == 2 * LIMIT, codes

    # SIGTERM to the supervisor with streams running on both workers: all finish, exit 0
    streams = [Stream(p.url, KEY_BULK, model="m") for _ in range(16)]
    for st in streams:
        st.start()
    _wait(lambda: all(len(st.events) > 1 for st in streams), 60, "streams to start")
    p.proc.send_signal(signal.SIGTERM)
    _, stderr = p.proc.communicate(timeout=60)
    assert p.proc.returncode == 0, stderr[-3000:]
    for st in streams:
        st.join(30)
        assert st.error is None and st.events[-1] == "[DONE]", st.body[-300:]
    chain_pids, served = _requests_by_chain(db)
    assert len(chain_pids) == 2  # one chain per worker, each sealed by its drain
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "audit", "verify", "--config", str(p.config),
         "--public-key", str(tmp_path / "audit.key.pub"), "--json"],
        cwd=ROOT, capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert len(report["chains"]) == 2 and all(c["closed"] for c in report["chains"])


def test_a_killed_worker_is_restarted_sighup_is_forwarded_and_a_second_signal_stops_at_once(
    pod: Callable[..., Pod],
) -> None:
    p = pod(audit=False)
    old = p.worker_pids()
    os.kill(old[0], signal.SIGKILL)
    _wait(lambda: len(p.worker_pids()) == 2 and old[0] not in p.worker_pids(), 120,
          "the worker to be restarted")
    assert old[1] in p.worker_pids()
    assert _total(p.metrics(), "sg_gateway_worker_restarts",
                  "sg_gateway_worker_restarts_total") == 1
    p.proc.send_signal(signal.SIGHUP)  # forwarded to every worker, which keeps serving
    assert p.get(p.url + "/healthz") is not None
    long = [Stream(p.url, KEY_BULK, max_tokens=1000, model="m") for _ in range(4)]  # about 20 s
    for st in long:
        st.start()
    _wait(lambda: all(len(st.events) > 1 for st in long), 60, "streams to start")
    p.proc.send_signal(signal.SIGTERM)
    _wait(lambda: (r := p.get(p.url + "/readyz")) is not None and r.status_code == 503, 5,
          "readyz 503 while draining")
    t_second = time.monotonic()
    p.proc.send_signal(signal.SIGINT)
    _, stderr = p.proc.communicate(timeout=30)
    assert time.monotonic() - t_second < 15  # not the 30 s drain timeout
    assert f"worker 0 (pid {old[0]}) exited unexpectedly (signal SIGKILL): restarting" in stderr
    assert "SIGHUP: forwarded to 2 worker(s)" in stderr
    assert stderr.count("exited unexpectedly") == 1  # the forwarded SIGHUP ended no worker
    for st in long:
        st.join(15)
        assert "[DONE]" not in st.events


def test_a_worker_whose_guard_self_test_fails_stops_the_pod(pod: Callable[..., Pod]) -> None:
    # A policy naming the self-test probe address: the guard would let it through.
    probe = ("  - {id: probe, cidr: 192.0.2.1/32, ports: [9], region: x, jurisdiction: EU, "
             "operator: o, purpose: other}\n")
    p = pod(audit=False, expect_start=False, extra_destination=probe)
    _, stderr = p.proc.communicate(timeout=120)
    assert p.proc.returncode == 3, stderr[-3000:]
    assert "[guard_self_test_failed]" in stderr
    assert "exited before it served (exit status 2): stopping the pod" in stderr
    with pytest.raises(httpx.ConnectError):
        httpx.get(p.url + "/healthz", timeout=1)


def test_memory_quotas_are_refused_with_several_workers(pod: Callable[..., Pod]) -> None:
    p = pod(quotas="memory", audit=False, expect_start=False)
    _, stderr = p.proc.communicate(timeout=60)
    assert p.proc.returncode == 2
    assert "quotas.backend: memory keeps quota state inside one process" in stderr
    assert f"{p.config}:" in stderr  # file:line: key: problem


def test_each_worker_enforces_its_share_of_a_flow_control_in_flight_threshold(
    pod: Callable[..., Pod], sim_url: str, tmp_path: Path,
) -> None:
    """``in_flight: 2`` with two workers: 2 requests on the replica for the pod, not 2 each.

    The simulator holds every request. Requests are sent one connection at a time until the
    replica holds 2: with one slot per worker that takes both workers (each audits its
    dispatch in its own chain). Every further request waits in its worker's queue, where with
    a threshold per worker (2 each) the worker that got a second one would have sent it.
    """
    sim = Sim(sim_url)
    sim.fault(mode="hang", count=100)
    p = pod(flow={"saturation": {"in_flight": 2}})
    port = int(p.url.rsplit(":", 1)[1])
    body = json.dumps({"model": "m", "stream": True, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hold"}]}).encode()
    held: list[socket.socket] = []

    def queued() -> float:
        return _total(p.metrics(), "sg_gateway_flow_queue_length")

    try:
        while len(held) < 4 or sim.stats()["received"] < 2:
            assert len(held) < 40, "the requests never reached both workers"
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                         b"content-type: application/json\r\n"
                         + f"authorization: Bearer {KEY_BULK}\r\n".encode()
                         + f"content-length: {len(body)}\r\n\r\n".encode() + body)
            held.append(sock)
            _wait(lambda: sim.stats()["received"] + queued() == len(held), 30,
                  "the request to reach the replica or a queue")
            assert sim.stats()["received"] <= 2
        # Both workers dispatched (one request each); the others wait in the gateway.
        _wait(lambda: len(_requests_by_chain(tmp_path / "audit.db")[1]) == 2, 30,
              "each worker's dispatch in its audit chain")
        assert queued() == len(held) - 2
        # A held request ends: the worker that sent it dispatches one of its own waiters
        # (if it has one), still at most 2 on the replica.
        held.pop(0).close()
        _wait(lambda: sim.stats()["running"] <= 2 and sim.stats()["cancelled"] >= 1, 30,
              "the closed request to end")
        assert sim.stats()["running"] <= 2
    finally:
        for sock in held:
            sock.close()


def test_a_flow_control_in_flight_threshold_below_the_workers_is_refused(
    pod: Callable[..., Pod],
) -> None:
    p = pod(flow={"saturation": {"in_flight": 1}}, audit=False, expect_start=False)
    _, stderr = p.proc.communicate(timeout=60)
    assert p.proc.returncode == 2, stderr[-3000:]
    assert "flow_control.saturation.in_flight: 1 is less than --workers 2" in stderr
    assert f"{p.config}:" in stderr  # file:line: key: problem


def test_in_memory_stores_are_refused_with_several_workers_and_allowed_with_one() -> None:
    from gateway.config.errors import InvalidConfig
    from gateway.config.loader import parse
    from gateway.serving.workers_check import check_workers

    settings = parse({
        "models": [{"name": "m", "replicas": [{"url": "http://127.0.0.1:9"}]}],
        "audit": {"store": "sqlite:///:memory:"},
        "keystore": {"store": "sqlite:///:memory:"},
        "quotas": {"backend": "memory"},
    }, {}, file="gw.yaml")
    check_workers(settings, 1)
    with pytest.raises(InvalidConfig) as err:
        check_workers(settings, 2)
    keys = [p.key for p in err.value.problems]
    assert keys == ["quotas.backend", "audit.store", "keystore.store"]
    assert all(p.file == "gw.yaml" for p in err.value.problems)
    assert settings.quotas is not None
    redis_quotas = settings.model_copy(update={"quotas": settings.quotas.model_copy(
        update={"backend": "redis"}), "audit": None, "keystore": None})
    check_workers(redis_quotas, 4)


# slow (42 s in the fast lane at load 8): test_a_sighup_while_the_workers_start_is_applied_once_
# they_serve makes the same assertions (the reload audited on both workers' chains, the added key
# served by both, no worker ended by the signal) for a SIGHUP sent earlier, in the fast lane.
@pytest.mark.slow
def test_a_sighup_to_the_supervisor_reloads_every_worker(
    pod: Callable[..., Pod], tmp_path: Path,
) -> None:
    """Each worker reloads the config file on the forwarded SIGHUP (its own settings kept:
    its audit chain) and audits the reload on its own chain; the new key works on every
    worker."""
    p = pod()
    new_key = "sg-workers-added-by-reload"
    cfg = yaml.safe_load(p.config.read_text())
    cfg["keys"].append({"id": "added", "sha256": _sha(new_key), "models": ["m"], "team": "t",
                        "data_class": "public"})
    p.config.write_text(yaml.safe_dump(cfg))
    p.proc.send_signal(signal.SIGHUP)
    db = tmp_path / "audit.db"

    def reloaded_chains() -> set[str]:
        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "SELECT chain FROM audit_records WHERE type = 'config.reloaded'").fetchall()
        return {chain for (chain,) in rows}

    _wait(lambda: len(reloaded_chains()) == 2, 60, "both workers to audit the reload")
    # One connection per request: the kernel spreads them over both workers.
    for _ in range(8):
        st = Stream(p.url, new_key, max_tokens=2, model="m")
        st.start()
        st.join(60)
        assert st.error is None and st.status == 200, st.body[-500:]
    assert len(p.worker_pids()) == 2  # no worker ended by the signal


def test_a_sighup_while_the_workers_start_is_applied_once_they_serve(
    pod: Callable[..., Pod], tmp_path: Path,
) -> None:
    """A SIGHUP that reaches the supervisor while its workers are still starting neither ends
    them (the pod would stop) nor is lost (they may have read the file already): each worker
    reloads once it serves, and the key added to the file works on every worker."""
    p = pod(expect_start=False)
    # The supervisor's admin port answers once its handlers are set, before a worker serves.
    _wait(lambda: p.get(p.admin + "/status") is not None or p.proc.poll() is not None, 60,
          "the supervisor's admin port")
    new_key = "sg-workers-added-while-starting"
    cfg = yaml.safe_load(p.config.read_text())
    cfg["keys"].append({"id": "added", "sha256": _sha(new_key), "models": ["m"], "team": "t",
                        "data_class": "public"})
    p.config.write_text(yaml.safe_dump(cfg))
    assert len(p.worker_pids()) < 2  # still starting
    p.proc.send_signal(signal.SIGHUP)
    db = tmp_path / "audit.db"

    def reloaded_chains() -> set[str]:
        if not db.exists():
            return set()
        with sqlite3.connect(db) as conn:
            try:
                rows = conn.execute(
                    "SELECT chain FROM audit_records WHERE type = 'config.reloaded'").fetchall()
            except sqlite3.OperationalError:  # the store exists, its schema not yet
                return set()
        return {chain for (chain,) in rows}

    _wait(lambda: len(reloaded_chains()) == 2 or p.proc.poll() is not None, 120,
          "both workers to audit the reload")
    assert p.proc.poll() is None, p.proc.communicate()[1][-3000:]
    for _ in range(8):  # one connection each: the kernel spreads them over both workers
        st = Stream(p.url, new_key, max_tokens=2, model="m")
        st.start()
        st.join(60)
        assert st.error is None and st.status == 200, st.body[-500:]
    assert len(p.worker_pids()) == 2


def test_pod_counters_do_not_drop_when_workers_restart(pod: Callable[..., Pod]) -> None:
    """A restarted worker starts its counters at zero; the pod's counters keep what the gone
    worker had counted (a drop would read as a counter reset and ``rate`` would count the
    surviving workers' totals again)."""
    p = pod(audit=False)
    for _ in range(6):  # one connection each: spread over the workers
        st = Stream(p.url, KEY_BULK, max_tokens=2, model="m")
        st.start()
        st.join(60)
        assert st.status == 200

    def served() -> float:
        return _total(p.metrics(), "sg_gateway_requests", "sg_gateway_requests_total")

    before = served()
    assert before == 6
    for victim in p.worker_pids():  # every worker once: whichever served the requests
        os.kill(victim, signal.SIGKILL)
        _wait(lambda v=victim: len(p.worker_pids()) == 2 and v not in p.worker_pids(), 120,
              "the worker to be restarted")
        assert served() >= before
    assert served() == before


# slow (14 s in CI): test_serve_workers_restart_config proves the same hand-over (a restarted
# worker starts from the last applied reload) with a revoked key, in the fast lane.
@pytest.mark.slow
def test_a_worker_restarted_after_a_reload_serves_the_reloaded_config(
    pod: Callable[..., Pod], tmp_path: Path,
) -> None:
    """A restarted worker starts from the settings of the last reload the workers applied, so
    a key added by an earlier reload works on it too (its own reload of the unchanged file, once
    it serves, finds no change: nothing more is audited)."""
    p = pod()
    new_key = "sg-workers-added-before-a-restart"
    cfg = yaml.safe_load(p.config.read_text())
    cfg["keys"].append({"id": "added", "sha256": _sha(new_key), "models": ["m"], "team": "t",
                        "data_class": "public"})
    p.config.write_text(yaml.safe_dump(cfg))
    p.proc.send_signal(signal.SIGHUP)
    db = tmp_path / "audit.db"

    def reloads() -> int:
        with sqlite3.connect(db) as conn:
            return int(conn.execute("SELECT count(*) FROM audit_records "
                                    "WHERE type = 'config.reloaded'").fetchone()[0])

    _wait(lambda: reloads() == 2, 60, "both workers to audit the reload")
    victim = p.worker_pids()[0]
    os.kill(victim, signal.SIGKILL)
    _wait(lambda: len(p.worker_pids()) == 2 and victim not in p.worker_pids(), 120,
          "the worker to be restarted")
    for _ in range(8):  # one connection each: the kernel spreads them over both workers
        st = Stream(p.url, new_key, max_tokens=2, model="m")
        st.start()
        st.join(60)
        assert st.error is None and st.status == 200, st.body[-500:]
    assert reloads() == 2
