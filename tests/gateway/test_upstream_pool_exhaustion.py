"""A request that waits for a free upstream connection is not a slow replica.

``limits.max_upstream_connections`` bounds the relay's connections (all replicas together); a
request that finds them all busy waits for one within ``timeouts.first_byte_s``. When that
deadline passed while it was still waiting, nothing was sent to any replica: the answer is a
503 naming the limit, and no replica is ejected (it was a 504 "did not send its first byte"
and the replica the request was routed to was taken out of rotation, so a busy gateway ejected
its healthy replicas one after another).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.gateway.helpers import KEY_A, settings, start_gateway, start_sim


def _post(url: str, stream: bool, max_tokens: int) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {KEY_A}"},
                      json={"model": "llama-3.1-8b", "stream": stream, "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": "hi"}]})


def test_waiting_for_a_free_upstream_connection_is_a_503_and_ejects_no_replica(
    serve_asgi: Callable[..., Any],
) -> None:
    # 30 ms between tokens: the 100-token stream holds the one connection for about 3 s.
    sims = [start_sim(serve_asgi, itl_s=0.03, tokens_per_response=100) for _ in range(2)]
    s = settings([sim.url for sim in sims], limits={"max_upstream_connections": 1},
                 timeouts={"connect_s": 1, "first_byte_s": 1, "idle_s": 5})
    url = start_gateway(serve_asgi, s)
    long: dict[str, httpx.Response] = {}
    holder = threading.Thread(target=lambda: long.setdefault("r", _post(url, True, 100)))
    holder.start()
    while sum(sim.stats()["received"] for sim in sims) == 0:
        time.sleep(0.02)

    waited = _post(url, False, 2)
    assert waited.status_code == 503, waited.text
    error = waited.json()["error"]
    assert error["code"] == "upstream_connections_exhausted"
    assert "limits.max_upstream_connections" in error["message"]

    holder.join(30)
    assert long["r"].status_code == 200
    before = [sim.stats()["received"] for sim in sims]
    for _ in range(6):
        assert _post(url, False, 2).status_code == 200
    after = [sim.stats()["received"] for sim in sims]
    assert all(a > b for a, b in zip(after, before, strict=True)), \
        f"a replica was ejected: requests per replica went from {before} to {after}"
