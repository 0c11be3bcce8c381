"""SIGTERM drains a real ``gateway serve`` process: readyz 503 at once, streams finish or end
with a final SSE error event at the deadline (audited), exit 0; a second signal stops at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import default_signals, free_port
from tests.conftest import wait_until as _wait
from tests.gateway.helpers import Stream, config, start_sim


class Gateway:
    def __init__(self, proc: subprocess.Popen[str], url: str, config: Path) -> None:
        self.proc = proc
        self.url = url
        self.config = config

    def readyz(self) -> int | None:
        try:
            return httpx.get(self.url + "/readyz", timeout=2).status_code
        except httpx.TransportError:
            return None


@pytest.fixture
def serve(tmp_path: Path, serve_asgi: Callable[..., Any]) -> Iterator[Callable[..., Gateway]]:
    # 1,000 tokens 20 ms apart: a stream of about 20 s unless max_tokens cuts it short.
    sim = start_sim(serve_asgi, itl_s=0.02, tokens_per_response=1000)
    procs: list[subprocess.Popen[str]] = []

    def start(delay_s: float, timeout_s: float, audit: dict[str, Any] | None = None) -> Gateway:
        port = free_port()
        cfg = config([sim.url], drain={"delay_s": delay_s, "timeout_s": timeout_s},
                     logging={"access_log": True, "format": "json"})
        cfg["listen"]["port"] = port
        if audit is not None:
            cfg["audit"] = {**audit, "replica_id": f"gw-{port}"}
        path = tmp_path / f"gw-{port}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc = subprocess.Popen(
            default_signals(
                [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "VLLM_KEY": "backend-key"},
        )
        procs.append(proc)
        gw = Gateway(proc, f"http://127.0.0.1:{port}", path)
        _wait(lambda: gw.readyz() == 200 or proc.poll() is not None, 60, "gateway start")
        assert proc.poll() is None, proc.communicate()[1]
        return gw

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_sigterm_drains_finishes_short_streams_and_ends_long_ones_with_an_error_event(
    serve: Callable[..., Gateway],
) -> None:
    gw = serve(delay_s=1.0, timeout_s=4.0)
    short, long = Stream(gw.url, max_tokens=50), Stream(gw.url, max_tokens=1000)  # ~1 s, ~20 s
    short.start()
    long.start()
    _wait(lambda: len(short.events) > 1 and len(long.events) > 1, 30, "both streams to start")

    t_term = time.monotonic()
    gw.proc.send_signal(signal.SIGTERM)
    # readyz turns 503 at once, while the listener still accepts (delay_s)
    _wait(lambda: gw.readyz() == 503, 1.0, "readyz 503")
    assert httpx.get(gw.url + "/readyz", timeout=2).json() == {"status": "draining"}

    short.join(30)
    assert short.error is None and short.events[-1] == "[DONE]"
    assert not any(isinstance(e, dict) and "error" in e for e in short.events)

    long.join(30)
    _, stderr = gw.proc.communicate(timeout=30)
    elapsed = time.monotonic() - t_term
    assert gw.proc.returncode == 0, stderr[-2000:]
    assert 4.0 <= elapsed < 4.0 + 8.0  # the deadline, not sooner; not the ~20 s of the stream
    assert long.error is None
    last = long.events[-1]
    assert last != "[DONE]" and last["error"]["code"] == "gateway_shutting_down", long.body[-300:]
    assert len(long.events) > 50  # it kept streaming during the drain

    # after delay_s the listener is closed
    with pytest.raises(httpx.TransportError):
        httpx.get(gw.url + "/healthz", timeout=2)
    access = [json.loads(line) for line in stderr.splitlines()
              if line.startswith("{") and '"type":"access"' in line]
    codes = sorted(str(a.get("error_code")) for a in access if a["path"].startswith("/v1/chat"))
    assert codes == ["None", "gateway_shutting_down"]  # both recorded; the cut one as such


def test_second_signal_during_the_drain_stops_at_once(serve: Callable[..., Gateway]) -> None:
    gw = serve(delay_s=0.5, timeout_s=60.0)
    long = Stream(gw.url, max_tokens=1000)
    long.start()
    _wait(lambda: len(long.events) > 1, 30, "the stream to start")
    gw.proc.send_signal(signal.SIGTERM)
    _wait(lambda: gw.readyz() == 503, 1.0, "readyz 503")
    t_second = time.monotonic()
    gw.proc.send_signal(signal.SIGINT)
    gw.proc.communicate(timeout=15)
    assert time.monotonic() - t_second < 10  # far from the 60 s drain timeout
    long.join(15)
    assert "[DONE]" not in long.events


def test_drain_settings_refuse_a_delay_longer_than_the_timeout() -> None:
    from pydantic import ValidationError

    from gateway.serving.drain import DrainSettings

    with pytest.raises(ValidationError, match=r"delay_s \(10\) must not exceed timeout_s \(5\)"):
        DrainSettings(delay_s=10, timeout_s=5)


def test_two_gateways_sharing_an_audit_store_one_drained_mid_way_nothing_truncated(
    serve: Callable[..., Gateway], tmp_path: Path,
) -> None:
    from gateway.audit import Signer, generate_key_file, write_key_pair

    key, pub = write_key_pair(Signer.generate(), tmp_path / "audit.key")
    audit = {"store": f"sqlite://{tmp_path / 'audit.db'}", "signing_key_file": str(key),
             "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key"))}
    a, b = serve(delay_s=0.5, timeout_s=30.0, audit=audit), serve(delay_s=0.5, timeout_s=30.0,
                                                                  audit=audit)
    streams = [Stream(gw.url, max_tokens=100) for gw in (a, b) for _ in range(10)]  # ~2 s each
    for st in streams:
        st.start()
    _wait(lambda: all(len(st.events) > 1 for st in streams), 60, "all streams to start")
    a.proc.send_signal(signal.SIGTERM)  # mid-way: every stream is running
    a.proc.communicate(timeout=40)
    assert a.proc.returncode == 0
    assert b.readyz() == 200  # the other gateway keeps serving
    b.proc.send_signal(signal.SIGTERM)
    b.proc.communicate(timeout=40)
    assert b.proc.returncode == 0
    for st in streams:
        st.join(30)
        assert st.error is None and st.events[-1] == "[DONE]", st.body[-300:]  # 0 truncated

    cli = [sys.executable, "-m", "gateway.cli", "audit"]
    res = subprocess.run([*cli, "verify", "--config", str(a.config), "--public-key", str(pub),
                          "--json"], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    report = json.loads(res.stdout)
    assert report["ok"] and report["findings"] == []
    assert len(report["chains"]) == 2 and all(c["closed"] for c in report["chains"])
    res = subprocess.run([*cli, "export", "--store", audit["store"]], capture_output=True,
                         text=True, check=True)
    done = [json.loads(line) for line in res.stdout.splitlines()]
    completed = [r for r in done if r["type"] == "request.completed"]
    assert len(completed) == 20  # every request audited, on both chains


def test_ctrl_c_twice_during_the_drain_stops_without_a_traceback(
    serve: Callable[..., Gateway],
) -> None:
    # What an operator does at a terminal: Ctrl-C starts the drain, a second Ctrl-C stops at
    # once. It ends the process with one line, not a traceback.
    gw = serve(delay_s=0.5, timeout_s=60.0)
    long = Stream(gw.url, max_tokens=1000)
    long.start()
    _wait(lambda: len(long.events) > 1, 30, "the stream to start")
    gw.proc.send_signal(signal.SIGINT)
    _wait(lambda: gw.readyz() == 503, 1.0, "readyz 503")
    gw.proc.send_signal(signal.SIGINT)
    _, stderr = gw.proc.communicate(timeout=15)
    long.join(15)
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "CancelledError" not in stderr, stderr[-3000:]
    # The drain was cut short: the last line must not say the gateway drained.
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("gateway: error [interrupted]: "), last
    assert "drained and stopped" not in last, last
