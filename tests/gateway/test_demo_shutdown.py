"""``make run`` (``python -m gateway.cli.demo``) stops cleanly on SIGTERM, SIGINT and SIGHUP.

The demo is started in its own session with SIGINT/SIGTERM/SIGHUP at their default disposition
(the test sets them itself, so it passes under ``nohup`` or from a background job). Once the
gateway answers, the demo gets the signal; afterwards its simulator must be gone, the temporary
config directory removed, and the exit code 0 (a server stopped on request, like uvicorn).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.conftest import default_signals

REPO = Path(__file__).resolve().parents[2]


def _wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (from /proc/<pid>/task/*/children, recursively)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                text = (task / "children").read_text()
            except OSError:
                continue
            for child in map(int, text.split()):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_demo_stops_simulator_and_removes_its_directory(
    sig: signal.Signals, tmp_path: Path
) -> None:
    out = tmp_path / "demo.out"  # a file, not a pipe: a leaked simulator would hold a pipe open
    err = tmp_path / "demo.err"
    with out.open("w") as sink, err.open("w") as err_sink:
        proc = subprocess.Popen(
            default_signals([sys.executable, "-m", "gateway.cli.demo"]), cwd=REPO, stdout=sink,
            stderr=err_sink, start_new_session=True,
        )
    children: set[int] = set()
    tmp: Path | None = None
    try:
        _wait_for(lambda: "demo key" in out.read_text() or proc.poll() is not None,
                  60, "the demo's banner")
        text = out.read_text()
        tmp = Path(re.search(r"config written to (\S+)", text)[1]).parent  # type: ignore[index]
        base = re.search(r"gateway\s+(http://127\.0\.0\.1:\d+)", text)[1]  # type: ignore[index]
        assert tmp.is_dir()

        def ready() -> bool:
            try:
                return httpx.get(base + "/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        _wait_for(ready, 60, "the gateway to be ready")
        children = _children(proc.pid)
        assert children, "the simulator runs as a child of the demo"
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        _wait_for(lambda: not any(_alive(pid) for pid in children), 10, "the simulator to exit")
        assert not tmp.exists(), f"{tmp} left behind"
        # The simulator's own stop line ("vllm-sim: error [interrupted]: ...") read as a
        # failure of the demo after a Ctrl-C.
        assert "error" not in err.read_text().replace("uvicorn.error", ""), err.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in children:  # what a failing demo left behind
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
