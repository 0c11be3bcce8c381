"""Start an inference engine on loopback, wait until it answers, run pytest against it, stop it.

Shared by the opt-in conformance runners (``run_vllm.py``, ``run_llamacpp.py``): each engine runs
in its own session (process group), logs to a file (no pipe to fill), and is stopped with
SIGTERM, then SIGKILL after 30 s, whatever the tests did. Several engines (two vLLM replicas for
the fleet-routing tests) start at once and must all be ready before pytest runs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound and released; the engine binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Engine:
    """One engine process to start.

    Attributes:
        name: Its name for the progress lines (``vLLM on http://...``).
        cmd: Its command line.
        log_path: Where its output goes (parents created).
        ready_url: Polled until it answers 200 (``/health``, ``/v1/models``).
    """

    name: str
    cmd: Sequence[str]
    log_path: Path
    ready_url: str


def serve_and_test(
    name: str,
    cmd: Sequence[str],
    env: Mapping[str, str],
    log_path: Path,
    ready_url: str,
    startup_timeout_s: float,
    test_env: Mapping[str, str],
    pytest_args: Sequence[str],
    poll_s: float = 1.0,
) -> int:
    """Run ``cmd`` until ``GET ready_url`` answers 200, then ``pytest pytest_args``.

    One engine: :func:`serve_all_and_test` with ``[Engine(name, cmd, log_path, ready_url)]``.

    Returns:
        pytest's exit status, or 2 when the engine did not come up.
    """
    return serve_all_and_test([Engine(name, cmd, log_path, ready_url)], env, startup_timeout_s,
                              test_env, pytest_args, poll_s)


def serve_all_and_test(
    engines: Sequence[Engine],
    env: Mapping[str, str],
    startup_timeout_s: float,
    test_env: Mapping[str, str],
    pytest_args: Sequence[str],
    poll_s: float = 1.0,
) -> int:
    """Start every engine (each in its own process group), wait until all answer, run pytest.

    Args:
        engines: The engines, started in order, all at once.
        env: The engines' environment.
        startup_timeout_s: Seconds to wait for all of them to be ready before giving up.
        test_env: Extra environment of the pytest run (the engines' URLs and model).
        pytest_args: Arguments of ``python -m pytest``.
        poll_s: Seconds between readiness polls.

    Returns:
        pytest's exit status, or 2 when an engine did not come up.
    """
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for engine in engines:
            engine.log_path.parent.mkdir(parents=True, exist_ok=True)
            with engine.log_path.open("wb") as log:  # the child keeps its own descriptor
                procs.append(subprocess.Popen(
                    list(engine.cmd), stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                    stdin=subprocess.DEVNULL, start_new_session=True))
            print(f"starting {engine.name} (log: {engine.log_path}) ...", flush=True)
        deadline = time.monotonic() + startup_timeout_s
        for engine, proc in zip(engines, procs, strict=True):
            while True:
                try:
                    if httpx.get(engine.ready_url, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    print(f"{engine.name} did not come up; see {engine.log_path}",
                          file=sys.stderr)
                    return 2
                time.sleep(poll_s)
            print(f"{engine.name} is up", flush=True)
        print("running the conformance tests", flush=True)
        return subprocess.call([sys.executable, "-m", "pytest", *pytest_args],
                               env={**os.environ, **test_env})
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
