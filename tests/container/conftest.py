"""Opt-in checks of the built container image (``make image``; not in CI).

Tests marked ``image`` run the image named by ``$SG_IMAGE`` with podman (runtime ``runc``) and
are skipped unless the variable is set; ``make image`` builds the image and sets it.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("SG_IMAGE"):
        return
    skip = pytest.mark.skip(reason="no image to test: set SG_IMAGE (make image)")
    for item in items:
        if item.get_closest_marker("image") is not None:
            item.add_marker(skip)
