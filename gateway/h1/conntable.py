"""Which client connections count against the caps, and which one makes room for a new one.

A connection that has proven nothing (opened and sent nothing, sent part of a request head, or
idle between two requests) must not starve one that carries a request. Without this, 50 idle
sockets held a gateway capped at 50 connections until the header timeout closed them, and the
attacker simply reconnected. :class:`ConnectionTable` keeps the open connections of one server
and, in the order they became idle, those that carry no request; when a new connection finds
the cap reached, the one idle the longest is closed to make room (nginx drains its "reusable"
connections the same way, ``ngx_drain_connections``): first one already answered that only
waits to close (lingering after an early answer, or dropping the rest of an answered request's
body: its client has its answer, so closing it costs nobody anything), then one that never
carried a request, then one idle between two requests (a flood of silent sockets then closes
its own kind, not the keep-alive connections of clients that sent requests; and a flood of
early-answered requests closes its own kind, not a client's new connection whose head is on its
way). Only when every connection is busy with a request is the newcomer refused.

With a per-address cap, one client address holds at most that many connections: a new one over
it replaces the oldest idle connection of the same address, or is refused when all of that
address's connections carry requests, so one peer churning connections closes only its own.

The table does no I/O: it tells the connection it chose (:meth:`Evictable.evict`), which closes
itself. Marking a connection busy or idle is one dict operation each (twice per request,
about 100 ns together); finding the connection idle the longest is ``next(iter(dict))``
(insertion order is idle order), a few microseconds at worst, only when a cap is reached.

The table is data plus its eviction policy: its dicts are public so that the server's
connection (:class:`gateway.h1.server.H1Connection`) makes the per-request transitions, and
the admission below the caps, as the same dict operations inline, without a call into this
module on every request (the request path's module bound, ``tests/gateway/
test_trace_modules.py``); :meth:`admit`, :meth:`busy`, :meth:`idle` and :meth:`remove` are the
reference the inline operations follow (``tests/gateway/test_h1_conntable.py`` drives the
reference, ``tests/gateway/test_connection_cap_eviction.py`` the server's inline path).
"""

from __future__ import annotations

import itertools
from enum import Enum, StrEnum
from typing import Generic, Protocol, TypeVar

__all__ = ["Admission", "ConnectionTable", "Evictable", "EvictionCause"]


class EvictionCause(StrEnum):
    """Why an idle connection was closed to make room."""

    CONNECTION_CAP = "connection_cap"
    """The server's ``max_connections`` was reached."""
    ADDRESS_CAP = "address_cap"
    """The new connection's address reached ``max_per_address``."""


class Admission(Enum):
    """The answer to a new connection."""

    ADMITTED = "admitted"
    FULL = "full"
    """Every connection carries a request: refuse (503)."""
    ADDRESS_FULL = "address_full"
    """Every connection of this address carries a request: refuse (429)."""


class Evictable(Protocol):
    """A connection the table may close to make room."""

    def evict(self, cause: EvictionCause) -> None:
        """Close now (the table already forgot it)."""


C = TypeVar("C", bound=Evictable)


class ConnectionTable(Generic[C]):
    """The open connections of one server, and the idle ones in the order they became idle.

    Args:
        max_connections: Open connections at most (``limits.max_client_connections``).
        max_per_address: Open connections of one client address at most
            (``limits.max_client_connections_per_address``); ``None``: no such cap.

    A connection is fresh (idle, never carried a request) from :meth:`admit` until
    :meth:`busy` (its request head is complete), and idle again from :meth:`idle` (its
    response is complete and it waits for the next one) until :meth:`busy` or
    :meth:`remove`; answered from :meth:`answered_early` (answered before its request was
    wholly read, or refused: it waits only to close, or for the rest of the body) until
    :meth:`idle` or :meth:`remove`. Answered connections make room first, then fresh ones,
    then idle ones, the one idle the longest first within each.
    """

    __slots__ = ("addresses", "answered", "fresh", "max_connections", "max_per_address", "open",
                 "resting", "turns")

    def __init__(self, max_connections: int, max_per_address: int | None = None) -> None:
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.open: dict[C, str | None] = {}
        """Open, counted connections -> their client address."""
        self.fresh: dict[C, int] = {}
        """Idle connections that never carried a request, oldest first -> their turn."""
        self.resting: dict[C, int] = {}
        """Idle connections between requests, oldest first -> their turn."""
        self.answered: dict[C, int] = {}
        """Answered connections waiting to close (or for the rest of a body), oldest first."""
        self.addresses: dict[str, dict[C, None]] = {}
        """Open connections per client address (kept only with ``max_per_address``)."""
        self.turns = itertools.count(1)
        """Turns numbering when connections became idle (``next()``, a C call)."""

    def __len__(self) -> int:
        return len(self.open)

    def __contains__(self, connection: object) -> bool:
        return connection in self.open

    @property
    def idle_count(self) -> int:
        """Open connections that carry no request now."""
        return len(self.answered) + len(self.fresh) + len(self.resting)

    def admit(self, connection: C, address: str | None) -> Admission:
        """Count a new connection in, closing an idle one first if a cap is reached.

        Args:
            connection: The new connection (idle until :meth:`busy`).
            address: Its client address (host), ``None`` when unknown (a Unix socket):
                not subject to the per-address cap.

        Returns:
            :attr:`Admission.ADMITTED` (the connection is counted), or why it must be refused
            (it is not counted then).
        """
        per_address = self.max_per_address
        if per_address is not None and address is not None:
            mine = self.addresses.get(address)
            if mine is not None and len(mine) >= per_address:
                victim = self._oldest_idle_of(mine)
                if victim is None:
                    return Admission.ADDRESS_FULL
                self._evict(victim, EvictionCause.ADDRESS_CAP)
        if len(self.open) >= self.max_connections:
            idle = self.answered or self.fresh or self.resting
            if not idle:
                return Admission.FULL
            self._evict(next(iter(idle)), EvictionCause.CONNECTION_CAP)
        self.open[connection] = address
        if per_address is not None and address is not None:
            self.addresses.setdefault(address, {})[connection] = None
        self.fresh[connection] = next(self.turns)
        return Admission.ADMITTED

    def busy(self, connection: C) -> None:
        """``connection`` carries a request now: never chosen to make room."""
        if self.resting.pop(connection, None) is None:
            self.fresh.pop(connection, None)

    def idle(self, connection: C) -> None:
        """``connection`` carries no request now: the newest idle one, unless it was idle
        already (it keeps its place) or is not counted (refused on connect)."""
        if connection in self.open and connection not in self.fresh:
            if self.answered:
                self.answered.pop(connection, None)
            self.resting.setdefault(connection, next(self.turns))

    def answered_early(self, connection: C) -> None:
        """``connection`` was answered (or refused) and waits only to close, or for the rest
        of its request's body: the first to make room, unless not counted."""
        if connection in self.open:
            if self.resting.pop(connection, None) is None:
                self.fresh.pop(connection, None)
            self.answered.setdefault(connection, next(self.turns))

    def remove(self, connection: C) -> None:
        """``connection`` closed (idempotent)."""
        if connection not in self.open:
            return
        address = self.open.pop(connection)
        if self.resting.pop(connection, None) is None and \
                self.fresh.pop(connection, None) is None:
            self.answered.pop(connection, None)
        if address is not None and self.max_per_address is not None:
            mine = self.addresses.get(address)
            if mine is not None:
                mine.pop(connection, None)
                if not mine:
                    del self.addresses[address]

    def _oldest_idle_of(self, mine: dict[C, None]) -> C | None:
        oldest: C | None = None
        oldest_rank = (3, 0)
        for connection in mine:  # at most max_per_address of them
            for order, kind in enumerate((self.answered, self.fresh, self.resting)):
                turn = kind.get(connection)
                if turn is not None:
                    if (order, turn) < oldest_rank:
                        oldest, oldest_rank = connection, (order, turn)
                    break
        return oldest

    def _evict(self, victim: C, cause: EvictionCause) -> None:
        self.remove(victim)
        victim.evict(cause)
