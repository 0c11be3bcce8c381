"""flow_control.reserve across gateway pods: three real ``gateway serve`` processes sharing
flow control through a real Redis (127.0.0.1:6379), in front of two vLLM simulators.

Which replica is reserved is decided from the config's order in every process, with no
coordination; the demand that widens the reserve is the fleet's (``flow_control.shared``).
What each simulator ran is read from its own request history: the ``x-request-id`` the
gateway sent it, which the client read from the response (``SENT``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
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
from tests.gateway.helpers import SERVED, Sim, start_sim, stop_processes

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"fast": "sg-reserve-pods-fast", "bulk": "sg-reserve-pods-bulk"}
HOLD_S = 0.5  # reserve.hold_s
# x-request-id -> (class, pod) of every request answered through a pod.
SENT: dict[str, tuple[str, str]] = {}


@dataclass
class Pod:
    """One ``gateway serve`` process (one worker)."""

    number: int
    proc: subprocess.Popen[str]
    url: str
    admin: str

    def widened(self) -> float | None:
        """``sg_gateway_flow_reserve_widened{model="m"}`` (``None``: no decision yet)."""
        text = httpx.get(self.admin + "/metrics", timeout=5).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if (sample.name == "sg_gateway_flow_reserve_widened"
                        and sample.labels.get("gen_ai_request_model") == "m"):
                    return sample.value
        return None

    def chat(self, cls: str, max_tokens: int = 4) -> int:
        """One streamed chat request of class ``cls`` read to its end; the status (its
        ``x-request-id`` is recorded in ``SENT``)."""
        key = KEYS["fast" if cls == "interactive" else "bulk"]
        with httpx.stream("POST", self.url + "/v1/chat/completions", timeout=60, json={
                "model": "m", "stream": True, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": "hi"}]},
                headers={"authorization": f"Bearer {key}"}) as resp:
            SENT[resp.headers["x-request-id"]] = (cls, str(self.number))
            for _ in resp.iter_bytes():
                pass
            return resp.status_code

    def hold(self, cls: str) -> socket.socket:
        """A streamed request of class ``cls`` on a raw socket (closing it is a disconnect)."""
        key = KEYS["fast" if cls == "interactive" else "bulk"]
        body = json.dumps({"model": "m", "stream": True, "max_tokens": 4,
                           "messages": [{"role": "user", "content": "hold"}]}).encode()
        sock = socket.create_connection(("127.0.0.1", int(self.url.rsplit(":", 1)[1])), 10)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\n"
                     + f"authorization: Bearer {key}\r\n".encode()
                     + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        return sock


def _seen(sim: Sim) -> list[tuple[str, str]]:
    """``(class, pod)`` of every chat request the simulator received, in order (``("held",
    "?")`` for a request no client saw answered: the held ones)."""
    return [SENT.get(h["headers"].get("x-request-id", ""), ("held", "?"))
            for h in sim.stats()["history"] if h["path"] == "/v1/chat/completions"]


@pytest.fixture
def fleet(serve_asgi: Callable[..., Any], tmp_path: Path, redis_prefix: str
          ) -> Iterator[tuple[list[Sim], list[Pod]]]:
    """Two simulators (replica 0 first in the pool: the reserve) and three gateway pods."""
    sims = [start_sim(serve_asgi, itl_s=0.01, tokens_per_response=100) for _ in range(2)]
    procs: list[subprocess.Popen[str]] = []
    pods: list[Pod] = []
    try:
        for number in (1, 2, 3):
            port, admin = free_port(), free_port()
            cfg: dict[str, Any] = {
                "listen": {"host": "127.0.0.1", "port": port},
                "models": [{"name": "m", "served_model_name": SERVED,
                            "replicas": [{"url": s.url} for s in sims]}],
                "keys": [{"id": kid, "sha256": hashlib.sha256(key.encode()).hexdigest(),
                          "models": ["m"]} for kid, key in KEYS.items()],
                "timeouts": {"connect_s": 2, "first_byte_s": 60, "idle_s": 60},
                "health": {"active": False},
                "logging": {"access_log": False},
                "drain": {"delay_s": 0},
                "telemetry": {"admin": {"host": "127.0.0.1", "port": admin}},
                "flow_control": {
                    "enabled": True,
                    # interactive: 2 per replica; batch: 1 per replica, 2 on the replica left
                    # to it while the reserve is narrow (lift).
                    "classes": [{"name": "interactive", "max_queue": 20, "max_wait_s": 60},
                                {"name": "batch", "max_queue": 50, "max_wait_s": 60,
                                 "saturation": {"in_flight": 1}}],
                    "default_class": "batch",
                    "saturation": {"in_flight": 2},
                    "keys": {"fast": {"class": "interactive"}, "bulk": {"class": "batch"}},
                    "shared": {"redis_url": "redis://127.0.0.1:6379/0",
                               "key_prefix": redis_prefix, "interval_s": 0.05},
                    # capacity 1 x 2: two interactive requests in flight widen it
                    "reserve": {"replicas": 1, "hold_s": HOLD_S},
                },
            }
            path = tmp_path / f"pod{number}.yaml"
            path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
            proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT)})
            procs.append(proc)
            pods.append(Pod(number, proc, f"http://127.0.0.1:{port}",
                            f"http://127.0.0.1:{admin}"))
        for pod in pods:
            def up(pod: Pod = pod) -> bool:
                assert pod.proc.poll() is None, pod.proc.communicate()[1][-3000:]
                try:
                    return httpx.get(pod.url + "/healthz", timeout=2).status_code == 200
                except httpx.TransportError:
                    return False
            _wait(up, 120, f"pod {pod.number} to serve")
        yield sims, pods
    finally:
        stop_processes(procs, 15)


def _in_threads(calls: list[Callable[[], int]]) -> list[int]:
    """Run ``calls`` at once, each in its own thread; their results in order."""
    results: list[int] = [0] * len(calls)

    def run(i: int) -> None:
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return results


@pytest.mark.slow  # three gateway processes
def test_every_pod_keeps_batch_off_the_reserve_and_widens_on_the_fleets_demand(
    fleet: tuple[list[Sim], list[Pod]],
) -> None:
    """Narrow: batch from every pod keeps off replica 0 while interactive requests, one at a
    time through each pod in turn, all run there. Two interactive requests in flight (pods 1
    and 2) widen the reserve in every pod, pod 3 included (the fleet's demand through Redis):
    batch from each then runs on replica 0. Once they end and hold_s passes, every pod narrows
    again. The reserve gauge of every pod follows."""
    sims, pods = fleet

    # 1. Narrow, interactive load that fits (one at a time, round robin over the pods) beside
    # a batch job sent through every pod: batch never reaches replica 0, interactive only it.
    def interactive_stream() -> int:
        bad = 0
        for i in range(9):
            bad += pods[i % 3].chat("interactive") != 200
            time.sleep(0.2)  # the finished request leaves the shared counts (interval 0.05 s)
        return bad

    def batch_worker(pod: Pod) -> int:
        return sum(pod.chat("batch", max_tokens=20) != 200 for _ in range(3))

    workers: list[Callable[[], int]] = [functools.partial(batch_worker, p)
                                        for p in pods for _ in range(2)]
    failures = _in_threads([interactive_stream, *workers])
    assert failures == [0] * 7
    on_reserve, on_other = _seen(sims[0]), _seen(sims[1])
    assert sorted(on_reserve) == sorted(("interactive", str(i % 3 + 1)) for i in range(9))
    assert sorted(on_other) == sorted(("batch", str(p)) for p in (1, 2, 3) for _ in range(6))
    assert [pod.widened() for pod in pods] == [0.0, 0.0, 0.0]
    for sim in sims:
        sim.reset()

    # 2. Two interactive requests in flight (pods 1 and 2) reach the capacity (1 x 2): every
    # pod widens on the fleet's demand, pod 3 too, which has none of them. Replica 1 is full
    # for batch once widened (two held batch requests, threshold 1), so batch sent through
    # any pod now runs on replica 0.
    sims[1].fault(mode="hang", count=2)
    holds = [pods[0].hold("batch"), pods[1].hold("batch")]
    _wait(lambda: len(_seen(sims[1])) == 2, 15, "two batch requests held on replica 1")
    sims[0].fault(mode="hang", count=2)
    holds += [pods[0].hold("interactive"), pods[1].hold("interactive")]
    _wait(lambda: len(_seen(sims[0])) == 2, 15, "two interactive requests held on replica 0")
    time.sleep(0.3)  # every pod reads the others' counts (interval 0.05 s)
    assert [pods[i].chat("batch") for i in (2, 0, 1)] == [200, 200, 200]
    assert [pod.widened() for pod in pods] == [1.0, 1.0, 1.0]
    assert _seen(sims[0]) == [("held", "?"), ("held", "?"),
                              ("batch", "3"), ("batch", "1"), ("batch", "2")]
    assert _seen(sims[1]) == [("held", "?"), ("held", "?")]

    # 3. The demand gone, every pod narrows after hold_s: batch keeps off replica 0 again.
    for sock in holds:
        sock.close()
    _wait(lambda: sims[0].stats()["running"] == 0 and sims[1].stats()["running"] == 0, 15,
          "the held requests cancelled upstream")
    time.sleep(0.3)
    for pod in pods:  # a decision that sees the calm (the calm starts here at the latest)
        assert pod.chat("batch") == 200
    time.sleep(HOLD_S + 0.3)
    for sim in sims:
        sim.reset()
    assert [pods[i].chat("batch") for i in (2, 0, 1)] == [200, 200, 200]
    assert [pod.widened() for pod in pods] == [0.0, 0.0, 0.0]
    assert _seen(sims[0]) == []
    assert _seen(sims[1]) == [("batch", "3"), ("batch", "1"), ("batch", "2")]
