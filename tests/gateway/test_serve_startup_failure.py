"""``gateway serve`` that cannot start says why in its last line, and exits 3.

uvicorn ends a failed start with ``sys.exit(3)`` after logging the cause (for a lifespan
failure, as a traceback); the CLI's own error line was missing, so an operator reading the end
of the output saw a JSON log line or ``Application startup failed. Exiting.``. A port in use,
for the API and for the admin (``/metrics``) listener, is the common case.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.config.settings import GatewaySettings
from tests.conftest import free_port
from tests.gateway.helpers import BACKEND_KEY, Sim, config

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("busy", ["listen", "admin"])
def test_a_port_in_use_is_named_in_the_last_line(sim: Sim, tmp_path: Path, busy: str) -> None:
    port, admin = free_port(), free_port()
    cfg = config([sim.url], listen={"host": "127.0.0.1", "port": port},
                 telemetry={"admin": {"host": "127.0.0.1", "port": admin}})
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port if busy == "listen" else admin))
        holder.listen()
        r = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config",
                            str(cfg_file)], cwd=ROOT, env={**os.environ, "VLLM_KEY": BACKEND_KEY},
                           capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 3, r.stderr[-2000:]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("gateway: error [startup_failed]: the gateway did not start: "), last
    busy_port = port if busy == "listen" else admin
    assert f"('127.0.0.1', {busy_port})" in last and "address already in use" in last
    assert "(hint: a port in use is listen.port or telemetry.admin.port" in last


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_invalid_file_is_one_error_line_per_problem(tmp_path: Path, workers: str) -> None:
    """README: "an invalid file stops the process with one line per problem naming file, line
    and key" (the boundary used to join them into one line), with or without workers."""
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text("listen: {host: 127.0.0.1, port: 99999}\nmodels: []\nbogus: 1\n",
                        encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg_file),
                        "--workers", workers], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert [line.split(": ", 3)[2] for line in lines] == [
        f"{cfg_file}:1", f"{cfg_file}:2", f"{cfg_file}:3"], lines
    assert all(line.startswith(f"gateway: error [config_error]: {cfg_file}:") for line in lines)
    # Every section of the config model, in its order (a new section joins the list).
    known = ", ".join(GatewaySettings.model_fields)
    assert lines[2].endswith(f": bogus: unknown key (known here: {known})"), lines[2]
    assert known.startswith("listen, models, keys, limits, timeouts, retries, health, logging")
