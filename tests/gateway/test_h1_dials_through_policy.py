"""Every connection of the relay's own client is dialed through the egress policy's connector.

New pooled connections and the fresh one of the stale-connection retry alike: a hostname is
resolved by the policy's resolver (checked and pinned: a rebinding answer is never used), an
address is checked by the policy's socket factory before the connect, and a refusal surfaces as
``EgressDenied`` (the relay answers ``upstream_egress_denied``), never as a connect failure.
"""

from __future__ import annotations

import pytest

from gateway.h1 import RelayClient, resolver_dialer
from policy import (
    EgressDenied,
    EgressMatcher,
    PinStore,
    Policy,
    PolicyResolver,
    checked_socket_factory,
)
from tests.gateway.test_h1_client import Backend, replies, run
from tests.policy.test_policy_transport import ScriptedResolver

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def _policy(port: int) -> Policy:
    dest = "region: lo, jurisdiction: EU, operator: me"
    return Policy.from_text(
        "version: 1\ndata_classes: [public]\ndestinations:\n"
        f"  - {{id: model, url: 'http://model.internal:{port}', {dest},"
        " resolves_to: [127.0.0.0/8]}\n"
        f"  - {{id: ip, url: 'http://127.0.0.1:{port}', {dest}}}\n"
    )


def _client(policy: Policy, resolver: ScriptedResolver, pins: PinStore) -> RelayClient:
    # No DNS cache: the policy's pin is what keeps a name on its checked address.
    matcher = EgressMatcher(policy, pins)
    dial = resolver_dialer(PolicyResolver(matcher, resolver), checked_socket_factory(matcher))
    return RelayClient(dial, tls=True, limit=0, keep_alive_s=30.0,
                       connect_s=5.0)


async def _get(c: RelayClient, url: str, fresh: bool = False) -> bytes:
    resp = await c.post(url, "/v1/x", {}, b"{}", fresh=fresh)
    body = b""
    while chunk := await resp.read():
        body += chunk
    resp.release()
    return body


def test_pooled_and_fresh_connections_resolve_through_the_policy_and_keep_the_pin() -> None:
    async def test() -> None:
        backend = Backend(replies(OK))
        url = await backend.start()
        port = int(url.rsplit(":", 1)[1])
        # The second answer would move the name off loopback (DNS rebinding): never asked for.
        resolver = ScriptedResolver({"model.internal": [["127.0.0.1"], ["192.0.2.5"]]})
        c = _client(_policy(port), resolver, PinStore())
        name = f"http://model.internal:{port}"
        assert await _get(c, name) == b"ok"
        assert await _get(c, name, fresh=True) == b"ok"  # the stale-connection retry's dial
        assert await _get(c, name, fresh=True) == b"ok"
        assert resolver.calls == ["model.internal"]
        assert backend.connections == 3
        head = backend.requests[-1].split(b"\r\n")
        assert f"host: model.internal:{port}".encode() in head
        await c.close()
        await backend.stop()

    run(test)


@pytest.mark.parametrize(("host", "answer", "reason"), [
    ("model.internal", ["192.0.2.5"], "outside resolves_to"),
    ("elsewhere.example", [], "no destination names"),
    ("127.0.0.2", [], "no destination"),  # an address literal: the socket factory's check
], ids=["resolution", "unnamed-host", "address"])
def test_a_refused_destination_is_egress_denied_and_nothing_is_sent(
    host: str, answer: list[str], reason: str,
) -> None:
    async def test() -> None:
        backend = Backend(replies(OK))
        url = await backend.start()
        port = int(url.rsplit(":", 1)[1])
        resolver = ScriptedResolver({host: [answer, answer]} if answer else {})
        c = _client(_policy(port), resolver, PinStore())
        for fresh in (False, True):
            with pytest.raises(EgressDenied, match=reason):
                await _get(c, f"http://{host}:{port}", fresh=fresh)
        assert backend.connections == 0 and c.open_connections == 0
        await c.close()
        await backend.stop()

    run(test)
