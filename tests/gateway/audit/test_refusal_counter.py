"""What :class:`gateway.audit.refusals.RefusalCounter` writes for many clients, and how client
addresses are grouped into networks (one IPv6 /64 is one client)."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.audit.refusals import RefusalCounter, client_network


def test_ipv6_clients_are_counted_by_network_and_ipv4_by_address() -> None:
    assert client_network("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    assert client_network("2001:db8:1:2:ffff:ffff:ffff:ffff") == "2001:db8:1:2::/64"
    assert client_network("2001:db8:1:3::1") == "2001:db8:1:3::/64"
    assert client_network("2001:db8:1:2:aaaa::1", 48) == "2001:db8:1::/48"
    assert client_network("fe80::1%eth0") == "fe80::/64"
    assert client_network("::ffff:192.0.2.7") == "192.0.2.7"
    assert client_network("192.0.2.7") == "192.0.2.7"
    assert client_network(None) is None
    assert client_network("/run/gateway.sock") == "/run/gateway.sock"


def test_clients_past_the_bound_fold_into_one_record_per_kind() -> None:
    records: list[dict[str, Any]] = []

    async def run() -> None:
        counter = RefusalCounter(records.append, interval_s=60, clients_per_interval=3)
        for i in range(1000):  # 1,000 clients, two requests each
            for _ in range(2):
                counter.add(400, "invalid_framing", "bad", f"client-{i}")
        counter.add(408, "request_timeout", "slow", "client-0")  # a known client: its own
        counter.add(408, "request_timeout", "slow", "client-999")
        assert [(r["client"], r["status"]) for r in records] == [
            ("client-0", 400), ("client-1", 400), ("client-2", 400), ("client-0", 408)]
        counter.flush()

    asyncio.run(run())
    flushed = [(r["client"], r["status"], r["count"], r.get("clients")) for r in records[4:]]
    # the folded clients with the most refusals (two each: the first of them) are named
    assert flushed == [("client-0", 400, 1, None), ("client-1", 400, 1, None),
                       ("client-2", 400, 1, None), ("client-3", 400, 2, None),
                       ("client-4", 400, 2, None), ("client-5", 400, 2, None),
                       (None, 400, 1988, 994), (None, 408, 1, 1)]
    assert len(records) == 12


def test_decoys_that_come_first_do_not_hide_a_busy_client() -> None:
    """Tester's F6: sixteen decoys sending one refused request each at the start of an
    interval took every own-record slot, and a key guesser's 500 refusals showed only in the
    ``client: null`` fold. The folded clients with the most refusals are named when the
    interval ends."""
    records: list[dict[str, Any]] = []

    async def run() -> None:
        counter = RefusalCounter(records.append, interval_s=60)
        for i in range(16):
            counter.add(401, "invalid_api_key", "unknown_key", f"decoy-{i}")
        for _ in range(500):
            counter.add(401, "invalid_api_key", "unknown_key", "guesser")
        counter.add(401, "invalid_api_key", "unknown_key", "one-off")
        counter.flush()

    asyncio.run(run())
    assert len(records) == 16 + 2  # the decoys' first records; then the guesser and the fold
    assert {k: records[16][k] for k in ("client", "count")} == {"client": "guesser",
                                                                   "count": 500}
    assert {k: records[17][k] for k in ("client", "count", "clients")} == {
        "client": None, "count": 1, "clients": 1}
