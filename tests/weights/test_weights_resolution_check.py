"""``weights pull`` checks every connection after resolution: a redirect to an allowed name
(``*.hf.co``) that resolves to the metadata address or a private address is refused before a
connection is opened; the endpoint's host and exactly named hosts may be private."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.hub_emulator import Hub, create_hub_app
from tests.hub_fixtures import SHARDED, HubServer
from weights import Lockfile
from weights.hub import HubClient
from weights.netcheck import AddressRefusedError, address_refusal
from weights.pin import pin
from weights.pull import pull_entry

NOW = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)


class Resolver:
    """Answers from a table (real addresses otherwise) and records every question."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.asked: list[str] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append(host)
        return self.table.get(host, [host])


@pytest.mark.parametrize(("answer", "reason"), [
    ("169.254.169.254", "link-local / cloud metadata"),
    ("10.1.2.3", "private, loopback or reserved"),
    ("127.0.0.1", "private, loopback or reserved"),
], ids=["metadata", "private", "loopback"])
def test_a_redirect_to_an_allowed_name_resolving_inward_is_refused_before_connecting(
    hub_server: HubServer, serve_asgi: Callable[..., Any], tmp_path: Path,
    answer: str, reason: str,
) -> None:
    cdn = Hub(tokens=())
    cdn.repos = hub_server.hub.repos
    port = serve_asgi(create_hub_app(cdn)).port
    hub_server.hub.redirect_to = f"http://cdn-lfs.hf.co:{port}"  # allowed by *.hf.co
    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, SHARDED, now=NOW)
    entry = Lockfile.load(lock).entry(SHARDED)
    resolver = Resolver({"cdn-lfs.hf.co": [answer]})
    dest = tmp_path / "model"
    with pytest.raises(AddressRefusedError, match=reason) as info:
        pull_entry(HubClient(hub_server.url, resolver=resolver), entry, into=dest)
    assert info.value.code == "address_refused"
    assert f"cdn-lfs.hf.co resolves to {answer}" in info.value.message
    assert "cdn-lfs.hf.co" in resolver.asked
    assert cdn.requests == []  # nothing reached the CDN (it is the only server at that port)


def test_an_exactly_named_host_may_be_private(
    hub_server: HubServer, serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    cdn = Hub(tokens=())
    cdn.repos = hub_server.hub.repos
    port = serve_asgi(create_hub_app(cdn)).port
    hub_server.hub.redirect_to = f"http://cdn.internal:{port}"
    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, SHARDED, now=NOW)
    entry = Lockfile.load(lock).entry(SHARDED)
    resolver = Resolver({"cdn.internal": ["127.0.0.1"]})
    pull_entry(HubClient(hub_server.url, redirect_hosts=["cdn.internal"], resolver=resolver),
               entry, into=tmp_path / "model")
    assert cdn.requests


@pytest.mark.parametrize(("address", "trusted", "refused"), [
    ("169.254.169.254", True, True), ("::ffff:169.254.169.254", True, True),
    ("fd00:ec2::254", True, True), ("100.100.100.200", True, True),
    ("192.168.1.1", False, True), ("192.168.1.1", True, False),
    ("8.8.8.8", False, False), ("2606:4700::1111", False, False),
])
def test_address_rule(address: str, trusted: bool, refused: bool) -> None:
    assert (address_refusal(address, trusted_name=trusted) is not None) is refused
