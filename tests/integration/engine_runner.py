"""Start an inference engine on loopback, wait until it answers, run pytest against it, stop it.

Shared by the opt-in conformance runners (``run_vllm.py``, ``run_llamacpp.py``): the engine runs
in its own session (process group), logs to a file (no pipe to fill), and is stopped with
SIGTERM, then SIGKILL after 30 s, whatever the tests did.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound and released; the engine binds it next)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

    Args:
        name: The engine's name for the progress lines (``vLLM``, ``llama.cpp server``).
        cmd: The engine's command line.
        env: The engine's environment.
        log_path: Where the engine's output goes (parents created).
        ready_url: Polled until it answers 200 (``/health``, ``/v1/models``).
        startup_timeout_s: Seconds to wait for readiness before giving up.
        test_env: Extra environment of the pytest run (the engine's URL and model).
        pytest_args: Arguments of ``python -m pytest``.
        poll_s: Seconds between readiness polls.

    Returns:
        pytest's exit status, or 2 when the engine did not come up.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=dict(env),
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + startup_timeout_s
            print(f"starting {name} (log: {log_path}) ...", flush=True)
            while True:
                try:
                    if httpx.get(ready_url, timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    print(f"{name} did not come up; see {log_path}", file=sys.stderr)
                    return 2
                time.sleep(poll_s)
            print(f"{name} is up; running the conformance tests", flush=True)
            return subprocess.call([sys.executable, "-m", "pytest", *pytest_args],
                                   env={**os.environ, **test_env})
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
