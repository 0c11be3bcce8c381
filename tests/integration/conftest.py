"""Backends for the conformance suite: the simulator always, a real vLLM when SG_VLLM_URL is set.

The same SDK checks run against each backend, directly and through the gateway:

* ``sim``: the vLLM simulator on a real uvicorn (part of ``make test``);
* ``vllm``: a real vLLM server at ``$SG_VLLM_URL`` serving ``$SG_VLLM_MODEL`` (default ``tiny``),
  marked ``vllm`` and skipped unless the variable is set (``make test-vllm`` sets it).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app as create_gateway
from gateway.config.loader import parse
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

GATEWAY_KEY = "sg-conformance-key"
MODEL = "tiny"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("SG_VLLM_URL"):
        return
    skip = pytest.mark.skip(reason="real vLLM not configured: set SG_VLLM_URL (make test-vllm)")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


@dataclass
class Target:
    """Where the SDK points: a backend directly or the gateway in front of it."""

    kind: str  # "sim" or "vllm"
    route: str  # "direct" or "gateway"
    base_url: str  # server root, without /v1
    backend_url: str  # the backend's root (metrics, tokenize)
    model: str
    max_model_len: int
    api_key: str
    client: openai.OpenAI

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{self.base_url}{path}", json=body, timeout=120,
                          headers={"authorization": f"Bearer {self.api_key}"})


def _backend_url(kind: str, serve_asgi: Callable[..., Any]) -> tuple[str, str]:
    if kind == "sim":
        app = create_sim(SimConfig(models=[MODEL], max_model_len=512, tokens_per_response=1000,
                                   itl_s=0.002))
        return str(serve_asgi(app).url), MODEL
    url = os.environ["SG_VLLM_URL"].rstrip("/")
    return url, os.environ.get("SG_VLLM_MODEL", MODEL)


@pytest.fixture(params=["sim", pytest.param("vllm", marks=pytest.mark.vllm)])
def backend(request: pytest.FixtureRequest, serve_asgi: Callable[..., Any]) -> tuple[str, str, str]:
    """``(kind, url, served model name)`` of the backend under test."""
    kind = str(request.param)
    url, model = _backend_url(kind, serve_asgi)
    return kind, url, model


def _client(base_url: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=120)


@pytest.fixture(params=["direct", "gateway"])
def target(request: pytest.FixtureRequest, backend: tuple[str, str, str],
           serve_asgi: Callable[..., Any]) -> Iterator[Target]:
    """The backend directly, or a gateway (``gateway.app.create_app``) in front of it."""
    kind, url, model = backend
    models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    max_len = int(next(m for m in models if m["id"] == model)["max_model_len"])
    if request.param == "direct":
        tgt = Target(kind, "direct", url, url, model, max_len, "none", _client(url, "none"))
        yield tgt
        tgt.client.close()
        return
    settings = parse({
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": MODEL, "served_model_name": model, "replicas": [{"url": url}]}],
        "keys": [{"id": "conformance",
                  "sha256": hashlib.sha256(GATEWAY_KEY.encode()).hexdigest(),
                  "models": [MODEL]}],
        "timeouts": {"connect_s": 5, "first_byte_s": 120, "idle_s": 120},
        "health": {"active": False},
        "logging": {"access_log": False},
    })
    gw = serve_asgi(create_gateway(settings))
    gw_url = str(gw.url)
    tgt = Target(kind, "gateway", gw_url, url, MODEL, max_len, GATEWAY_KEY,
                 _client(gw_url, GATEWAY_KEY))
    yield tgt
    tgt.client.close()
