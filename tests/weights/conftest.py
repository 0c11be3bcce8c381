"""Fixtures of the weights tests: the hub emulator plugin (until tests/conftest.py registers
``tests.hub_fixtures`` through ``pytest_plugins``)."""

from tests.hub_fixtures import hub, hub_server, minilm_blobs  # noqa: F401
