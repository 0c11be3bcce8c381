"""``vllm-sim --api-key`` / ``SimConfig.api_key``: vLLM's ``--api-key`` on the simulator.

vLLM's authentication middleware answers every ``/v1`` request without
``Authorization: Bearer <key>`` with 401 ``{"error": "Unauthorized"}`` and leaves its other
routes (``/health``, ``/metrics``) open. The simulator does the same, so a gateway's keyed
replica (``api_key_env`` / ``api_key_file``) can be tried on loopback: the gateway sends the
replica's key, never the client's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from tests.conftest import free_port, wait_until
from tests.gateway.helpers import BACKEND_KEY, KEY_A, settings, start_sim

VLLM_SIM = Path(sys.executable).with_name("vllm-sim")


def test_v1_routes_need_the_key_and_the_others_stay_open(
    serve_asgi: Callable[..., Any],
) -> None:
    sim = start_sim(serve_asgi, api_key="replica-secret")
    assert httpx.get(sim.url + "/health", timeout=5).status_code == 200
    assert httpx.get(sim.url + "/metrics", timeout=5).status_code == 200
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "replica-secret"}):
        r = httpx.get(sim.url + "/v1/models", headers=headers, timeout=5)
        assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"}), headers
    ok = httpx.get(sim.url + "/v1/models", timeout=5,
                   headers={"authorization": "Bearer replica-secret"})
    assert ok.status_code == 200


def test_the_gateway_sends_the_replicas_key_not_the_clients(
    serve_asgi: Callable[..., Any],
) -> None:
    keyed = start_sim(serve_asgi, api_key=BACKEND_KEY)
    other = start_sim(serve_asgi, api_key="another-key")
    for sim, works in ((keyed, True), (other, False)):
        s = settings([sim.url], retries={"max_attempts": 1})
        url = str(serve_asgi(create_app(s)).url)
        with openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0) as client:
            if works:
                assert _chat(client).choices[0].message.content
            else:
                with pytest.raises(openai.APIStatusError):
                    _chat(client)


def _chat(client: openai.OpenAI) -> Any:
    return client.chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=2)


@pytest.mark.parametrize("how", ["option", "environment"])
def test_the_console_script_takes_the_key_as_vllm_does(how: str) -> None:
    """``--api-key KEY``, or ``VLLM_API_KEY`` in the environment (vLLM reads both)."""
    port = free_port()
    args = [str(VLLM_SIM), "--port", str(port)]
    env = dict(os.environ)
    env.pop("VLLM_API_KEY", None)
    if how == "option":
        args += ["--api-key", "cli-secret"]
    else:
        env["VLLM_API_KEY"] = "cli-secret"
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(url), 20, "vllm-sim to listen")
        assert httpx.get(url + "/v1/models", timeout=5).status_code == 401
        assert httpx.get(url + "/v1/models", timeout=5,
                         headers={"authorization": "Bearer cli-secret"}).status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
