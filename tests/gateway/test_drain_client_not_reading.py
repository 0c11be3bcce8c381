"""A client that stops reading a stream does not hold the drain past the orchestrator's grace.

At the drain deadline a running stream is cut and ends with a final SSE error event; the write
of that event waits for the client. A client that never reads again held the process until
uvicorn's own backstop (``delay_s + timeout_s + 5`` s after the signal), past the
``terminationGracePeriodSeconds`` the chart sets (``timeout_s + 5``): the kubelet's SIGKILL
came before the lifespan shutdown sealed the audit chain.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.serving.drain import SHUTDOWN_MARGIN_S
from tests.conftest import wait_until
from tests.gateway.helpers import KEY_A, audit_export, config, start_sim
from tests.gateway.test_live_reload import Served

DELAY_S, TIMEOUT_S = 1.0, 2.0


def test_a_stream_whose_client_stopped_reading_ends_within_the_grace_period(
    tmp_path: Path, serve_asgi: Callable[..., Any],
) -> None:
    sim = start_sim(serve_asgi, tokens_per_response=200_000, max_model_len=400_000)
    gw = Served(tmp_path, config([sim.url], drain={"delay_s": DELAY_S, "timeout_s": TIMEOUT_S}))
    client = socket.socket()
    try:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", gw.port))
        body = json.dumps({"model": "llama-3.1-8b", "stream": True, "max_tokens": 200_000,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
                       b"authorization: Bearer " + KEY_A.encode() + b"\r\n"
                       b"content-type: application/json\r\n"
                       b"content-length: %d\r\n\r\n" % len(body) + body)
        # Never read: once the socket buffers are full, every write of the gateway waits.
        wait_until(lambda: _queued(client) > 0, 30, "the response to start")
        time.sleep(2)
        started = time.monotonic()
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(60) == 0
        took = time.monotonic() - started
        assert took < TIMEOUT_S + SHUTDOWN_MARGIN_S, f"{took:.1f} s: past the grace period"
        types = [r["type"] for r in _records(gw.store)]
        assert types[-1] == "chain.closed"  # the lifespan shutdown ran: the chain is sealed
        ends = [r["data"] for r in _records(gw.store) if r["type"] == "request.completed"]
        assert [e["error_code"] for e in ends] == ["gateway_shutting_down"]
        verify = subprocess.run([sys.executable, "-m", "gateway.cli", "audit", "verify",
                                 "--store", gw.store], capture_output=True, text=True)
        assert verify.returncode == 0, verify.stdout + verify.stderr
    finally:
        client.close()
        gw.stop()


def _queued(sock: socket.socket) -> int:
    """Bytes waiting in ``sock``'s receive queue (FIONREAD)."""
    import fcntl
    import termios

    buf = bytearray(4)
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
    return int.from_bytes(buf, sys.byteorder)


def _records(store: str) -> list[dict[str, Any]]:
    return audit_export(store)
