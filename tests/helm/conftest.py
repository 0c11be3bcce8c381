"""Helm chart test options.

``pytest tests/helm --update-golden`` (or env ``SG_UPDATE_GOLDEN=1`` from anywhere) rewrites the
golden renders in tests/helm/golden/ instead of comparing them byte for byte.
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/helm/golden/*.yaml from the current chart instead of comparing",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the golden files are to be rewritten (explicit flag only)."""
    # default=False: when pytest starts from the repository root this conftest is not an
    # initial one, so the option exists only under `pytest tests/helm --update-golden`.
    return bool(request.config.getoption("--update-golden", default=False)) or (
        os.environ.get("SG_UPDATE_GOLDEN") == "1"
    )
