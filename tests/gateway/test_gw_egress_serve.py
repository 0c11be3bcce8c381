"""The process egress guard in a real ``gateway serve`` (subprocess), with the audit log on.

The gateway process may reach its three replicas (policy destinations) and nothing else: a
connection from inside it to a listening loopback port no destination names is blocked, counted
and recorded as an ``egress.denied`` audit record. A policy that would let the self-test probe
through makes ``gateway serve`` refuse to start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from gateway.audit import Signer, generate_key_file, write_key_pair
from tests.conftest import free_port
from tests.gateway.egress_testdata import KEYS, gateway_config, policy_text
from tests.gateway.helpers import audit_export
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

ROOT = Path(__file__).parents[2]
PROC = Path(__file__).with_name("_egress_serve_proc.py")


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url + "/healthz", timeout=1).raise_for_status()
            return
        except httpx.HTTPError:
            assert proc.poll() is None, "gateway exited"
            assert time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.1)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A loopback port that accepts connections but is no policy destination."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        s.settimeout(0.3)
        yield s


def test_guard_blocks_a_non_destination_in_gateway_serve(
    serve_asgi: Callable[..., Any], tmp_path: Path, listener: socket.socket
) -> None:
    sims = {name: create_sim(SimConfig(models=["m"])) for name in ("eu-a", "eu-b", "us")}
    servers = {name: serve_asgi(app) for name, app in sims.items()}
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(policy_text({n: s.port for n, s in servers.items()}))
    port = free_port()
    cfg = gateway_config({n: s.url for n, s in servers.items()}, pfile, guard="enforce",
                         port=port)
    cfg["health"] = {"active": True, "interval_s": 0.2, "timeout_s": 1}
    key, _ = write_key_pair(Signer.generate(), tmp_path / "audit.key")
    db = tmp_path / "audit.db"
    cfg["audit"] = {
        "store": f"sqlite://{db}", "signing_key_file": str(key), "replica_id": "guard-test",
        "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key")),
    }
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    trigger, result = tmp_path / "go", tmp_path / "probe.txt"
    target = listener.getsockname()[1]
    cmd = [sys.executable, str(PROC), str(trigger), str(result), str(target), "--",
           "serve", "--config", str(cfg_file)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    url = f"http://127.0.0.1:{port}"
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE) as proc:
        try:
            _wait_ready(url, proc)
            client = openai.OpenAI(base_url=url + "/v1", api_key=KEYS["conf"], max_retries=0,
                                   timeout=20)
            for _ in range(3):
                resp = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
                assert resp.choices[0].message.content
            assert {n: a.state.received for n, a in sims.items()} == {
                "eu-a": 3, "eu-b": 0, "us": 0}
            # health checks go through the policy-checked connector: all replicas healthy
            deadline = time.monotonic() + 10
            while httpx.get(url + "/readyz", timeout=5).status_code != 200:
                assert time.monotonic() < deadline, "replicas not ready through the connector"
                time.sleep(0.05)
            trigger.touch()
            deadline = time.monotonic() + 10
            while not result.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            outcome = result.read_text()
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=20)
    assert outcome.startswith("EgressBlocked"), outcome
    with pytest.raises(TimeoutError):
        listener.accept()  # nothing ever reached the non-destination
    log = stderr.decode()
    assert f"egress blocked: 127.0.0.1:{target}" in log
    records = audit_export(f"sqlite://{db}")
    denied = [r["data"] for r in records if r["type"] == "egress.denied"]
    assert len(denied) == 1, denied
    assert denied[0]["port"] == target and denied[0]["decision"] == "deny"
    assert denied[0]["event"] == "socket.connect"
    loaded = [r["data"] for r in records if r["type"] == "policy.loaded"]
    assert loaded and loaded[0]["guard"] == "enforce"


def test_serve_refuses_to_start_when_the_guard_self_test_fails(tmp_path: Path) -> None:
    # A policy that names the self-test probe address: the guard would let it through.
    extra = "  - {id: probe, cidr: 192.0.2.1/32, ports: [9], region: x, jurisdiction: EU, " \
            "operator: o, purpose: other}\n"
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(policy_text({"eu-a": 9001, "eu-b": 9002, "us": 9003},
                                 extra_destinations=extra))
    port = free_port()
    urls = {n: f"http://127.0.0.1:{p}" for n, p in (("eu-a", 9001), ("eu-b", 9002),
                                                     ("us", 9003))}
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text(yaml.safe_dump(gateway_config(urls, pfile, guard="enforce", port=port)))
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg_file)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert res.returncode == 2
    assert "[guard_self_test_failed]" in res.stderr
    assert "self-test" in res.stderr
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
