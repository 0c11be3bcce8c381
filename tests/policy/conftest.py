"""Fixtures for the policy tests."""

from __future__ import annotations

import pytest
from policy_testdata import BASE

from policy import Policy


@pytest.fixture
def policy() -> Policy:
    """The shared test policy, compiled."""
    return Policy.from_text(BASE, "base.yaml")
