"""What a ``gateway serve`` or ``check-config`` without an ``mcp:`` section imports.

jsonschema (the MCP argument checks, :mod:`gateway.mcp.arguments`) builds the grammars of its
optional format checkers at import: about 1.5 s of CPU, more than the rest of the gateway's
start-up imports, paid by every gateway process (and by each of the hundreds that the tests
start) although only an ``mcp:`` section uses it. The import trace is taken through the real
entry point, ``python -X importtime -m gateway.cli check-config``, which assembles the gateway
as ``serve`` does.

The same for the sections a plain gateway does not have: the identity token checks (PyJWT, and
httpx, which imports its own command line: click, rich, pygments), the telemetry service (the
OpenTelemetry SDK, ``requests``) and the flow-control peers (the Redis client). Together about
a third of the start-up CPU of each ``gateway serve``; the serving gateway's trace is taken
from a real ``gateway serve`` that answered on its port.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """\
listen: {host: 127.0.0.1, port: 0}
models:
  - name: m
    replicas: [{url: "http://127.0.0.1:9"}]
"""


def _imported(tmp_path: Path) -> set[str]:
    """Every module the check-config of ``CONFIG`` imports (``-X importtime`` lines)."""
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gateway.cli", "check-config", "--config",
         str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [x for x in done.stderr.splitlines() if x.startswith("import time:")]
    return {x.rsplit("|", 1)[1].strip() for x in lines[1:]}  # the first line is the header


def test_a_gateway_without_mcp_does_not_import_the_mcp_schema_checks(tmp_path: Path) -> None:
    modules = _imported(tmp_path)
    assert "gateway.assembly" in modules and "gateway.config.loader" in modules  # it assembled
    assert not {m for m in modules if m.split(".")[0] in ("jsonschema", "rfc3987_syntax")}
    assert "gateway.mcp.arguments" not in modules and "gateway.mcp.wiring" not in modules


#: Imported only with the section that needs it (identity, telemetry, flow_control.shared).
UNCONFIGURED = ("httpx", "jwt", "requests", "redis", "opentelemetry.sdk.trace",
                "gateway.identity.auth", "gateway.telemetry.service", "gateway.flow.peers")


def _served_imports(tmp_path: Path) -> set[str]:
    """Every module a ``gateway serve`` of ``CONFIG`` imported by the time it answered."""
    port = free_port()
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG.replace("port: 0", f"port: {port}")
                    + "health: {active: false}\ndrain: {delay_s: 0}\n", encoding="utf-8")
    trace = tmp_path / "importtime.txt"
    with trace.open("w") as err:  # a file: the trace outgrows a pipe's buffer
        proc = subprocess.Popen(
            [sys.executable, "-X", "importtime", "-m", "gateway.cli", "serve", "--config",
             str(path)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
        try:
            def answered() -> bool:
                assert proc.poll() is None, trace.read_text()[-3000:]
                try:  # any answer: serving (its one replica is down, so not ready)
                    httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
                except httpx.TransportError:
                    return False
                return True

            wait_until(answered, 60, "gateway serve to answer")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    lines = [x for x in trace.read_text().splitlines() if x.startswith("import time:")]
    return {x.rsplit("|", 1)[1].strip() for x in lines[1:]}


def test_a_plain_gateway_serves_without_the_modules_of_its_absent_sections(
    tmp_path: Path,
) -> None:
    modules = _served_imports(tmp_path)
    assert "gateway.app" in modules and "gateway.serving.run" in modules  # it served
    assert "aiohttp" in modules  # the relay's client: the trace is the serving process's
    assert not {m for m in modules if m.split(".")[0] in UNCONFIGURED or m in UNCONFIGURED}


def test_check_config_of_a_plain_gateway_skips_them_too(tmp_path: Path) -> None:
    modules = _imported(tmp_path)
    assert "gateway.assembly" in modules
    assert not {m for m in modules if m.split(".")[0] in UNCONFIGURED or m in UNCONFIGURED}
