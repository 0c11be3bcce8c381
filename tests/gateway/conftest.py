"""Fixtures for the gateway tests: a simulator and a gateway in front of it (real uvicorn)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
import redis

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


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A unique key prefix on the shared Redis (127.0.0.1:6379), cleaned up after the test."""
    prefix = f"sg:q:test:{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()
