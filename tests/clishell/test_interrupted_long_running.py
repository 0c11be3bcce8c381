"""Ctrl-C (SIGINT) and SIGTERM stop every long-running command with 130 / 143 and one error line.

Each command runs as a real child process with the default signal dispositions (set by the
test: a shell starts background jobs with SIGINT ignored, and the child would inherit that);
the test waits until it runs (follows the log, serves, or blocks reading its config), sends the
signal and checks the exit status and that standard error holds exactly one error line,
``PROG: error [interrupted]: interrupted by SIG...`` (``gateway audit tail -f`` exited 0 on
Ctrl-C: a follow loop read as success). ``gateway serve``'s drain on SIGTERM is the documented
exception: exit 0 and no error line; SIGINT drains the same way and then exits 130.

The commands that write (``weights pull/pin/sign``, ``airgap pack/unpack/verify``) are
interrupted at a known point by ``tests/weights/cli_util.py``'s ``run_interrupted`` in
``tests/weights/test_weights_interrupt.py``, ``test_weights_pull_visibility.py`` and
``tests/airgap/test_interrupt.py``, which also check that nothing was left half-written; here
``policy`` and ``gateway preflight`` are interrupted the same way.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import default_signals, free_port, wait_until
from tests.gateway.helpers import BACKEND_KEY, config, start_sim
from tests.weights.cli_util import run_interrupted

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ERROR_LINE = re.compile(r"^(?P<prog>[a-z-]+): error \[(?P<code>[a-z_]+)\]: (?P<what>.+?)"
                        r"(?: \(hint: (?P<hint>.+)\))?$")


@dataclass
class Child:
    """A started command: its process and where its output goes (files: never a full pipe)."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    fds: list[int] = field(default_factory=list)  # closed at teardown

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")


@dataclass
class Case:
    """One long-running command: how to start it and how to tell that it runs."""

    prog: str
    start: Callable[[Path, Callable[..., Any]], tuple[list[str], Callable[[Child], bool]]]


def _serving(url: str) -> Callable[[Child], bool]:
    def ready(child: Child) -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.TransportError:
            return False
    return ready


def _gateway_config(tmp: Path, serve_asgi: Callable[..., Any]) -> tuple[Path, str]:
    sim = start_sim(serve_asgi)
    port = free_port()
    cfg = config([sim.url], drain={"delay_s": 0, "timeout_s": 5})
    cfg["listen"]["port"] = port
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, f"http://127.0.0.1:{port}"


def _audit_tail(tmp: Path, serve_asgi: Callable[..., Any]) -> tuple[list[str], Any]:
    from gateway.audit import AuditLog, Signer, open_store

    url = f"sqlite://{tmp / 'audit.db'}"

    async def write() -> None:
        log = AuditLog(open_store(url), Signer.generate(), replica_id="r1")
        await log.start()
        await log.append({"type": "request.started", "request_id": "req-1"})
        await log.close()

    asyncio.run(write())
    # Following: it printed the existing records and polls for new ones.
    return (["gateway", "audit", "tail", "-f", "--store", url],
            lambda child: "request_id=req-1" in child.stdout())


def _serve_starting(tmp: Path, serve_asgi: Callable[..., Any]) -> tuple[list[str], Any]:
    # The config is a FIFO whose writer stays silent: `serve` blocks reading it, in start-up.
    fifo = tmp / "gateway.yaml"
    os.mkfifo(fifo)

    def reading(child: Child) -> bool:
        if not child.fds:
            try:  # ENXIO until a reader (the child) has the FIFO open
                child.fds.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                return False
        return True  # the writer stays open: the child's read blocks until the signal

    return ["gateway", "serve", "--config", str(fifo)], reading


def _serve(tmp: Path, serve_asgi: Callable[..., Any]) -> tuple[list[str], Any]:
    path, url = _gateway_config(tmp, serve_asgi)
    return ["gateway", "serve", "--config", str(path)], _serving(url + "/readyz")


def _serve_workers(tmp: Path, serve_asgi: Callable[..., Any]) -> tuple[list[str], Any]:
    path, _ = _gateway_config(tmp, serve_asgi)

    def both_ready(child: Child) -> bool:  # the supervisor logs once every worker serves
        return "2 workers serving on" in child.stderr()

    return ["gateway", "serve", "--config", str(path), "--workers", "2"], both_ready


def _vllm_sim(tmp: Path, serve_asgi: Callable[..., Any]) -> tuple[list[str], Any]:
    port = free_port()
    return (["vllm-sim", "--port", str(port)],
            _serving(f"http://127.0.0.1:{port}/health"))


CASES = {
    "gateway audit tail -f": Case("gateway", _audit_tail),
    "gateway serve (starting)": Case("gateway", _serve_starting),
    "gateway serve": Case("gateway", _serve),
    "gateway serve --workers 2": Case("gateway", _serve_workers),
    "vllm-sim": Case("vllm-sim", _vllm_sim),
}
# (command, signal, exit status; None: no error line). SIGTERM to `gateway serve` once it
# serves is its documented graceful drain (docs/gateway.md): exit 0.
RUNS = [
    ("gateway audit tail -f", signal.SIGINT, 130),
    ("gateway audit tail -f", signal.SIGTERM, 143),
    ("gateway serve (starting)", signal.SIGINT, 130),
    ("gateway serve (starting)", signal.SIGTERM, 143),
    ("gateway serve", signal.SIGINT, 130),
    ("gateway serve", signal.SIGTERM, 0),
    ("gateway serve --workers 2", signal.SIGINT, 130),
    ("vllm-sim", signal.SIGINT, 130),
    ("vllm-sim", signal.SIGTERM, 143),
]


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Child]]:
    children: list[Child] = []
    yield children
    for child in children:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait(10)
        for fd in child.fds:
            os.close(fd)


@pytest.mark.parametrize(("name", "sig", "status"), RUNS,
                         ids=[f"{n}-{s.name}" for n, s, _ in RUNS])
def test_a_signal_stops_a_long_running_command_with_its_exit_status_and_one_error_line(
    name: str, sig: signal.Signals, status: int, tmp_path: Path,
    serve_asgi: Callable[..., Any], started: list[Child],
) -> None:
    case = CASES[name]
    argv, running = case.start(tmp_path, serve_asgi)
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("wb") as out_file, err.open("wb") as err_file:
        child = Child(subprocess.Popen(
            default_signals([str(BIN / argv[0]), *argv[1:]]), cwd=ROOT, stdout=out_file,
            stderr=err_file, env={**os.environ, "VLLM_KEY": BACKEND_KEY}), out, err)
    started.append(child)
    wait_until(lambda: running(child) or child.proc.poll() is not None, 90, f"{name} to run")
    assert child.proc.poll() is None, child.stderr()[-3000:]

    child.proc.send_signal(sig)
    assert child.proc.wait(30) == status, child.stderr()[-3000:]
    stderr = child.stderr()
    errors = [line for line in stderr.splitlines() if ERROR_LINE.match(line)]
    assert "Traceback" not in stderr
    if status == 0:  # the documented graceful drain
        assert errors == [], stderr[-3000:]
        return
    assert len(errors) == 1, stderr[-3000:]
    if name == "gateway audit tail -f":  # it only reads: nothing to "resume" or half-write
        assert "stopped reading the log" in errors[0], errors
        assert "resume" not in errors[0] and "half-written" not in errors[0], errors
    match = ERROR_LINE.match(errors[0])
    assert match is not None
    assert (match["prog"], match["code"]) == (case.prog, "interrupted")
    assert match["what"].startswith(f"interrupted by {sig.name}; "), errors[0]
    assert match["hint"], errors[0]
    if name == "vllm-sim":  # a server: nothing was being written, nothing to resume
        assert match["what"] == f"interrupted by {sig.name}; the simulator shut down", errors[0]
        assert "resume" not in match["hint"], errors[0]


@pytest.mark.parametrize(("cli", "module", "attr", "argv", "sig"), [
    ("policy.cli", "policy.evaluate", ("Policy", "from_file"),
     ["check", str(ROOT / "examples" / "policy.yaml")], "SIGINT"),
    ("gateway.cli", "gateway.preflight.checks", ("run_preflight",),
     ["preflight", "--policy", str(ROOT / "examples" / "policy.yaml")], "SIGTERM"),
], ids=["policy check", "gateway preflight"])
def test_policy_and_preflight_interrupted_exit_by_the_signal(
    cli: str, module: str, attr: tuple[str, ...], argv: list[str], sig: str,
) -> None:
    *owner, name = attr
    res = run_interrupted(module, tuple(owner), name, sig, argv, cli=cli, after=1)
    assert res.returncode == 128 + getattr(signal, sig), res.stdout + res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"{cli.split('.')[0]}: error [interrupted]: interrupted by {sig}; "), res.stderr
