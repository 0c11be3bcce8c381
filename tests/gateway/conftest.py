"""Fixtures for the gateway tests: a simulator and a gateway in front of it (real uvicorn)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from tests.gateway.helpers import Clients, Sim, settings, start_gateway, start_sim


@pytest.fixture
def sim(serve_asgi: Callable[..., Any]) -> Sim:
    """A simulator serving the test model."""
    return start_sim(serve_asgi)


@pytest.fixture
def gateway_url(serve_asgi: Callable[..., Any], sim: Sim) -> str:
    """A gateway with one replica (the simulator)."""
    return start_gateway(serve_asgi, settings([sim.url]))


@pytest.fixture
def clients() -> Iterator[Clients]:
    """Factory of openai SDK clients, ``clients(url, key=KEY_A)``; all closed at teardown."""
    factory = Clients()
    yield factory
    factory.close()


@pytest.fixture
def client(gateway_url: str, clients: Clients) -> openai.OpenAI:
    """The official OpenAI SDK pointed at the gateway with team-a's key (no SDK retries)."""
    return clients(gateway_url)
