"""Gateway start-up helpers: replica/destination binding and a guard that proves itself."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
import uvloop
from policy_testdata import BASE

from policy import (
    BindingError,
    GuardSelfTestFailed,
    Policy,
    UnknownDestination,
    check_binding,
    start_guard,
)


def test_binding_accepts_urls_inside_their_destination(policy: Policy) -> None:
    check_binding(policy, "http://10.20.0.11:8000", "vllm-eu-a")
    check_binding(policy, "http://[::ffff:10.20.0.12]:8000/", "vllm-eu-b")
    check_binding(policy, "https://API.Provider.Example./v1", "provider-us")


@pytest.mark.parametrize(
    ("url", "dest", "message"),
    [
        ("http://10.20.0.12:8000", "vllm-eu-a", "host is not destination vllm-eu-a"),
        ("http://10.20.0.11:8001", "vllm-eu-a", "port 8001 is not a port"),
        ("http://api.provider.example:443", "vllm-eu-a", "port 443"),
        ("https://api.provider.example.evil/v1", "provider-us", "host is not destination"),
        ("http://api.provider.example/v1", "provider-us", "port 80"),
    ],
)
def test_binding_refuses_a_mislabelled_replica(
    policy: Policy, url: str, dest: str, message: str
) -> None:
    with pytest.raises(BindingError, match=message) as info:
        check_binding(policy, url, dest)
    assert info.value.code == "destination_mismatch"


def test_binding_unknown_destination(policy: Policy) -> None:
    with pytest.raises(UnknownDestination):
        check_binding(policy, "http://10.20.0.11:8000", "nowhere")


@pytest.fixture
def closed_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    yield port


def test_start_guard_off_installs_nothing(policy: Policy) -> None:
    assert start_guard(policy, "off") is None


def test_start_guard_installs_and_self_tests(policy: Policy, closed_port: int) -> None:
    guard = start_guard(policy, "enforce", self_test_target=("127.0.0.1", closed_port))
    assert guard is not None
    try:
        assert guard.installed and list(guard.events) == []
    finally:
        guard.uninstall()


def test_start_guard_refuses_uvloop(policy: Policy, closed_port: int) -> None:
    async def boot() -> None:
        start_guard(policy, "enforce", self_test_target=("127.0.0.1", closed_port))

    loop = uvloop.new_event_loop()
    try:
        with pytest.raises(GuardSelfTestFailed, match="uvloop"):
            loop.run_until_complete(boot())
    finally:
        loop.close()


def test_failed_self_test_leaves_no_guard_behind(closed_port: int) -> None:
    policy = Policy.from_text(BASE.replace(
        "destinations:\n",
        "destinations:\n  - {id: probe, host: 127.0.0.1, port: " + str(closed_port)
        + ", region: lo, jurisdiction: EU, operator: me}\n", 1))
    with pytest.raises(GuardSelfTestFailed, match="allowed by the policy"):
        start_guard(policy, "enforce", self_test_target=("127.0.0.1", closed_port))
    # No guard remains: a connection the base policy would deny is attempted for real.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", closed_port), timeout=1)

    async def probe() -> None:
        await asyncio.open_connection("127.0.0.1", closed_port)

    with pytest.raises(ConnectionRefusedError):
        asyncio.run(probe())
