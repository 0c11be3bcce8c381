"""Fixtures for the audit tests: a store URL per backend, a fresh signer."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.audit import Signer


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty audit store URL on each backend."""
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'audit.db'}"
    dsn: str = request.getfixturevalue("pg_database")
    return dsn


@pytest.fixture
def signer() -> Signer:
    return Signer.generate()
