"""Fixtures of the quota tests: limiter backends on the real Redis at 127.0.0.1:6379.

Every test gets its own key prefix and every key under it is deleted afterwards, so tests of
other engineers sharing that Redis are never touched.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis

from tests.conftest import free_port

REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest, redis_prefix: str) -> AsyncIterator[Any]:
    """Each backend in turn: a MemoryLimiter, and a RedisLimiter on the shared Redis."""
    from gateway.quotas import MemoryLimiter, RedisLimiter

    lim: Any
    if request.param == "memory":
        lim = MemoryLimiter()
    else:
        lim = RedisLimiter(REDIS_URL, key_prefix=redis_prefix)
    await lim.start()
    yield lim
    await lim.aclose()


class RedisServer:
    """A throwaway redis-server subprocess on its own port (for outage tests)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING."""
        exe = shutil.which("redis-server")
        assert exe, "redis-server is not installed"
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_timeout=0.2).ping()
                return self
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def stop(self) -> None:
        """Kill the server (SIGKILL: an abrupt outage)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None


@pytest.fixture
def throwaway_redis() -> Iterator[Callable[[], RedisServer]]:
    """Factory of private redis-server processes, killed at teardown (never the shared one)."""
    servers: list[RedisServer] = []

    def make() -> RedisServer:
        srv = RedisServer(free_port()).start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


OPEN_CLIENTS: list[Any] = []
"""SDK clients a quota test opened (``openai.OpenAI``): closed after each test."""


@pytest.fixture(autouse=True)
def _close_sdk_clients() -> Iterator[None]:
    yield
    while OPEN_CLIENTS:
        OPEN_CLIENTS.pop().close()


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest, redis_prefix: str) -> dict[str, Any]:
    """The ``quotas:`` backend keys: in memory, or on the shared Redis under its own prefix."""
    if request.param == "memory":
        return {"backend": "memory"}
    return {"backend": "redis", "redis_url": REDIS_URL, "key_prefix": redis_prefix}
