"""Fixtures of the keystore tests: each store kind on a real database."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'audit.db'}"
    return str(request.getfixturevalue("pg_database"))


class Events:
    """Collects audit events; can be told to fail like an unavailable audit store."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.fail = False

    async def __call__(self, event: Mapping[str, Any]) -> None:
        if self.fail:
            raise RuntimeError("audit store unavailable")
        self.items.append(dict(event))


@pytest.fixture
def events() -> Events:
    return Events()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Callable[..., Clock]:
    return Clock
