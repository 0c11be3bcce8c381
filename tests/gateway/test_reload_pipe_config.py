"""``gateway serve --config FIFO`` (or ``<(...)``): served from the pipe; a live reload is
refused instead of waiting for a writer for ever.

Before, a SIGHUP made the reload thread open the FIFO again and wait for a writer: it held the
reload lock (every later reload queued behind it) and kept the process from exiting after its
drain, SIGTERM and SIGINT alike; only SIGKILL ended it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.conftest import default_signals, free_port, wait_until
from tests.gateway.helpers import BACKEND_KEY, config, start_sim


def test_a_reload_of_a_config_read_from_a_pipe_is_refused_and_the_gateway_still_stops(
    tmp_path: Path, serve_asgi: Callable[..., Any],
) -> None:
    sim = start_sim(serve_asgi)
    port = free_port()
    cfg = config([sim.url], drain={"delay_s": 0, "timeout_s": 5},
                 reload={"watch": True, "interval_s": 0.2})
    cfg["listen"]["port"] = port
    fifo = tmp_path / "gateway.yaml"
    os.mkfifo(fifo)
    log = tmp_path / "gateway.log"

    def write_once() -> None:
        with open(fifo, "w", encoding="utf-8") as fh:  # waits for the gateway to open it
            fh.write(yaml.safe_dump(cfg))

    writer = threading.Thread(target=write_once, daemon=True)
    writer.start()
    with log.open("w") as err:
        proc = subprocess.Popen(
            default_signals([sys.executable, "-m", "gateway.cli", "serve", "--config",
                             str(fifo)]),
            stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "VLLM_KEY": BACKEND_KEY})
    try:
        def ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return proc.poll() is not None
        wait_until(ready, 60, "the gateway to serve the piped config")
        assert proc.poll() is None, log.read_text()
        writer.join(10)

        for _ in range(2):  # the second is not queued behind a stuck first one
            before = log.read_text().count("refused")
            proc.send_signal(signal.SIGHUP)
            wait_until(lambda b=before: log.read_text().count("refused") > b, 30,
                       "the reload to be refused")
        text = log.read_text()
        assert f"{fifo}: not a regular file (a pipe or FIFO is read once, at start)" in text
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_check_config_reads_a_pipe_as_serve_does(tmp_path: Path) -> None:
    """``gateway check-config --config <(envsubst ...)``: it refused the pipe as "not a
    regular file" (after opening it twice) while ``serve`` served it."""
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config(["http://127.0.0.1:1"])))
    res = subprocess.run(
        ["bash", "-c", 'exec "$0" -m gateway.cli check-config --config <(cat "$1")',
         sys.executable, str(path)],
        capture_output=True, text=True, check=False, env={**os.environ, "VLLM_KEY": "x"},
        cwd=tmp_path, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert ": OK (listen 127.0.0.1:0)" in res.stdout
