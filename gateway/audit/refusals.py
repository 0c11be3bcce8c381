"""Refused connections and requests, counted: few audit records per interval, whoever sends.

The HTTP server refuses requests before the app sees them (malformed heads, timeouts, the
connection cap), and the relay, ``/v1/models`` and MCP refuse callers that established no
principal (no credential, an unknown key or token). One record per refusal let a single client
write tens of thousands of records a minute (42,000 in 20 s; 13,555 in 10 s guessing keys)
into the tamper-evident chain. :class:`RefusalCounter` writes the first refusal of a (client,
kind) at once (``count: 1``) and counts the next ones of the same key until the interval ends,
then writes one record with their ``count``.

Clients are counted by network, not by address (:func:`client_network`: IPv4 /32, IPv6 /64 by
default), since one IPv6 /64 gives anyone 2**64 addresses. And at most
:data:`CLIENTS_PER_INTERVAL` distinct clients get records of their own per interval: the
refusals of any further client fold into one record per kind, written when the interval ends,
with ``client: null``, the ``count`` of refusals and the number of distinct ``clients``
(exact up to :data:`MAX_TRACKED`, ``clients_capped: true`` past it), except the folded clients
with the most refusals (up to :data:`CLIENTS_PER_INTERVAL` of them, with more than one each),
who get records of their own then: clients that come first (decoys sending one request each)
cannot hide a busy one, a key guesser, in the fold. An interval so writes at most
``2 * CLIENTS_PER_INTERVAL`` records per kind of refusal, ``CLIENTS_PER_INTERVAL`` more in all
and one per kind, whatever the number of addresses the attacker holds; the counter holds at
most :data:`MAX_KEYS` keys and :data:`MAX_TRACKED` folded clients.

The idle connections the server closes to make room for new ones (``http.evicted``) are
counted the same way, per client and (state, cause), with :meth:`RefusalCounter.count`.
"""

from __future__ import annotations

import asyncio
import heapq
import ipaddress
from collections.abc import Callable, Hashable
from typing import Any

__all__ = [
    "CLIENTS_PER_INTERVAL",
    "INTERVAL_S",
    "IPV6_PREFIX",
    "MAX_KEYS",
    "MAX_TRACKED",
    "RefusalCounter",
    "client_network",
]

INTERVAL_S = 10.0
"""Seconds over which the refusals of one client and reason are counted into one record."""

CLIENTS_PER_INTERVAL = 16
"""Distinct clients (networks) with records of their own per interval and counter.

Sixteen names every source of an ordinary incident (a misconfigured client, a scanner, a few
hosts behind one NAT) on its own; more than that is a distributed source, which one folded
record describes as well as thousands would (how many clients, how many refusals). The bound
keeps a flood from any number of networks at a few records a second: at most 32 records per
kind and interval (each client's first at once and its rest when the interval ends), one
folded record per kind and 16 for the busiest folded clients in all: about 3.3-5 records/s
per kind at the 10 s interval, where one record per address let 1,500 loopback addresses
write 1,500 records in 0.6 s."""

MAX_KEYS = 4096
"""Most (client, kind) keys and folded kinds counted at once (the counter's memory bound)."""

MAX_TRACKED = 4096
"""Most distinct folded clients told apart per interval (``clients_capped`` past it)."""

IPV6_PREFIX = 64
"""Default prefix length by which IPv6 clients are counted (one /64 is one client)."""

_Key = tuple[str | None, Hashable]  # (client, what happened)


class _Folded:
    """The refusals of one kind from clients past :data:`CLIENTS_PER_INTERVAL`."""

    __slots__ = ("capped", "clients", "count", "fields")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.count = 0
        self.clients: dict[str | None, int] = {}  # client -> its refusals of this kind
        self.capped = False


def client_network(host: str | None, ipv6_prefix: int = IPV6_PREFIX) -> str | None:
    """The network a client address is counted under.

    Args:
        host: The peer's address as the server saw it (``"192.0.2.7"``, ``"2001:db8::1"``,
            ``"::ffff:192.0.2.7"``); ``None`` or anything that is no IP address (a Unix
            socket path) is returned unchanged.
        ipv6_prefix: Prefix length (0-128) of an IPv6 client's network.

    Returns:
        An IPv4 address as is (a /32; an IPv4-mapped IPv6 address as its IPv4 address), an
        IPv6 address as its network in CIDR form (``"2001:db8::/64"``).
    """
    if host is None or ":" not in host:
        return host  # IPv4 (/32), or no IP address at all
    try:
        address = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.IPv6Network((address, ipv6_prefix), strict=False))


class RefusalCounter:
    """Counts refusals per client and kind; emits the records to write.

    Args:
        emit: Called with each record's fields (those given to :meth:`count`, e.g.
            ``status``, ``error_code``, ``reason``; then ``client``, ``count``,
            ``interval_ms``; a folded record also ``clients`` and ``clients_capped``); must
            not block.
        interval_s: The counting interval, in seconds.
        clients_per_interval: Distinct clients with records of their own per interval.
    """

    def __init__(self, emit: Callable[[dict[str, Any]], None],
                 interval_s: float = INTERVAL_S,
                 clients_per_interval: int = CLIENTS_PER_INTERVAL) -> None:
        self._emit = emit
        self.interval_s = interval_s
        self.clients_per_interval = clients_per_interval
        # key -> [count since emitted, fields, totals of the counted events]
        self._counts: dict[_Key, list[Any]] = {}
        self._clients: set[str | None] = set()  # clients with records of their own
        self._folded: dict[Hashable, _Folded] = {}  # kind -> the other clients' refusals
        self._timer: asyncio.TimerHandle | None = None

    def add(self, status: int, code: str, reason: str, client: str | None) -> None:
        """One refusal (on the event loop), counted per (client, status, code)."""
        self.count(client, (status, code),
                   {"status": status, "error_code": code, "reason": reason})

    def count(self, client: str | None, kind: Hashable, fields: dict[str, Any],
              totals: tuple[str, ...] = ()) -> None:
        """One event of ``kind`` from ``client`` (on the event loop).

        Args:
            client: The client (pseudonym of its network), ``None`` when unknown.
            kind: What happened; events are counted per (client, kind).
            fields: The record's own fields (the first event's are written for the key).
            totals: Fields summed over the events a later record counts (numbers added,
                ``{name: number}`` mappings added per name), e.g. durations and bytes; the
                others are the first event's. Not kept for folded clients.
        """
        key: _Key = (client, kind)
        entry = self._counts.get(key)
        if entry is not None:
            entry[0] += 1
            if totals:
                _add(entry[2], fields, totals)
            return
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._tick)
        clients = self._clients
        if len(self._counts) < MAX_KEYS and (
                client in clients or len(clients) < self.clients_per_interval):
            clients.add(client)
            self._counts[key] = [0, fields, {}]
            self._emit(self._record(key, fields, 1))
            return
        folded = self._folded.get(kind)
        if folded is None:
            if len(self._folded) >= MAX_KEYS:
                return  # a kind past the memory bound: counted nowhere (never reached)
            folded = self._folded[kind] = _Folded(fields)
        folded.count += 1
        seen = folded.clients.get(client)
        if seen is not None:
            folded.clients[client] = seen + 1
        elif len(folded.clients) < MAX_TRACKED:
            folded.clients[client] = 1
        else:
            folded.capped = True  # more clients than told apart

    def _record(self, key: _Key, fields: dict[str, Any], count: int) -> dict[str, Any]:
        return {**fields, "client": key[0], "count": count,
                "interval_ms": round(self.interval_s * 1000)}

    def _tick(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> None:
        """Emit the counts not yet written and start a new interval."""
        counts, self._counts = self._counts, {}
        folded, self._folded = self._folded, {}
        self._clients = set()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for key, (count, fields, summed) in counts.items():
            if count:
                self._emit(self._record(key, {**fields, **summed}, count))
        # The folded clients with the most refusals are named: the first clients of an
        # interval (decoys sending one request each) cannot hide a busy one in the fold.
        busiest = heapq.nlargest(
            self.clients_per_interval,
            ((n, client, entry) for entry in folded.values()
             for client, n in entry.clients.items() if n > 1),
            key=lambda item: item[0])
        for n, client, entry in busiest:
            self._emit(self._record((client, None), entry.fields, n))
            entry.count -= n
            del entry.clients[client]
        for entry in folded.values():
            if entry.count:
                self._emit({**self._record((None, None), entry.fields, entry.count),
                            "clients": len(entry.clients), "clients_capped": entry.capped})


def _add(summed: dict[str, Any], fields: dict[str, Any], totals: tuple[str, ...]) -> None:
    """Add ``fields``' ``totals`` into ``summed`` (numbers; ``{name: number}`` per name)."""
    for name in totals:
        value = fields.get(name)
        if isinstance(value, dict):
            into = summed.setdefault(name, {})
            for item, n in value.items():
                into[item] = into.get(item, 0) + n
        elif isinstance(value, int | float) and not isinstance(value, bool):
            summed[name] = summed.get(name, 0) + value
