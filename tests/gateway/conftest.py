"""Fixtures for the gateway tests: a simulator and a gateway in front of it (real uvicorn)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.gateway.helpers import KEY_A, Sim, settings, start_gateway, start_sim


@pytest.fixture
def sim(serve_asgi: Callable[..., Any]) -> Sim:
    """A simulator serving the test model."""
    return start_sim(serve_asgi)


@pytest.fixture
def gateway_url(serve_asgi: Callable[..., Any], sim: Sim) -> str:
    """A gateway with one replica (the simulator)."""
    return start_gateway(serve_asgi, settings([sim.url]))


@pytest.fixture
def client(gateway_url: str) -> openai.OpenAI:
    """The official OpenAI SDK pointed at the gateway with team-a's key (no SDK retries)."""
    return openai.OpenAI(base_url=gateway_url + "/v1", api_key=KEY_A, max_retries=0, timeout=20)
