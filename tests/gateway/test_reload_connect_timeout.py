"""A live reload of ``timeouts.connect_s`` reaches the relay's upstream connections.

The key is reloadable (:data:`gateway.reload.RELOADABLE`); the relay's client read it once at
start, so a reload was reported as applied while connections kept the old limit.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.helpers import KEY_A, config
from tests.gateway.test_live_reload import Served


@pytest.fixture
def unanswered_listener() -> Iterator[str]:
    """A loopback port whose accept queue is full: a connect to it hangs (SYNs dropped)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = socket.create_connection(("127.0.0.1", port), timeout=5)  # fills the queue
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        queued.close()
        listener.close()

def test_a_reloaded_connect_timeout_applies_to_new_connections(
    tmp_path: Path, unanswered_listener: str,
) -> None:
    cfg = config([unanswered_listener], timeouts={"connect_s": 30, "first_byte_s": 60,
                                                  "idle_s": 60})
    gw = Served(tmp_path, cfg)
    try:
        gw.write({**gw.cfg, "timeouts": {**gw.cfg["timeouts"], "connect_s": 1}})
        gw.hup_and_wait("config.reloaded")
        started = time.monotonic()
        r = httpx.post(gw.url + "/v1/chat/completions", timeout=15,
                       headers={"authorization": f"Bearer {KEY_A}"},
                       json={"model": "llama-3.1-8b",
                             "messages": [{"role": "user", "content": "hi"}]})
        took = time.monotonic() - started
        assert r.status_code == 504, r.text
        assert r.json()["error"]["code"] == "upstream_connect_timeout"
        assert took < 10, f"{took:.1f} s: the old 30 s connect limit still applied"
    finally:
        gw.stop()
