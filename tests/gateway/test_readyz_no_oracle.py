"""``/readyz`` is unauthenticated: it gives probes the state, never the model names.

It listed every configured model with its replica counts, a model-name oracle beside
``/v1/models`` (which shows a key only its own models, and a wrong key nothing). Real gateway
and simulator on loopback, httpx as the probe.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.conftest import free_port
from tests.gateway.helpers import SERVED, Sim, settings, start_gateway


def test_readyz_says_ready_or_not_and_names_nothing(
    serve_asgi: Callable[..., Any], sim: Sim
) -> None:
    up = start_gateway(serve_asgi, settings([sim.url]))
    dead = f"http://127.0.0.1:{free_port()}"
    down = start_gateway(serve_asgi, settings(
        [dead], health={"active": True, "interval_s": 0.1, "timeout_s": 0.5, "cooldown_s": 30}))
    ready = httpx.get(up + "/readyz", timeout=5)
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
    for _ in range(50):  # the active probe marks the dead replica
        not_ready = httpx.get(down + "/readyz", timeout=5)
        if not_ready.status_code == 503:
            break
        time.sleep(0.1)
    assert (not_ready.status_code, not_ready.json()) == (503, {"status": "not_ready"})
    for body in (ready.text, not_ready.text):
        for name in ("llama-3.1-8b", "other-model", "default", SERVED, "replicas"):
            assert name not in body
