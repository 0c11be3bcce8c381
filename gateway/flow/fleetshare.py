"""Fair shares between keys that hold across gateway processes (``flow_control.shared``).

Each process keeps, per ``(model, class, flow)`` (a flow is a key, an identity or a team, as
``share_by`` and :mod:`gateway.flow.classify` say), the cost it *dispatched* recently (its
requests handed a replica: 1 each, or their estimated tokens with ``share_cost: tokens``),
decayed with a half-life of ``fair_half_life_s``, and the requests waiting in its queues.
:class:`gateway.flow.peers.FlowPeers` publishes both with the per-replica in-flight counts every
``interval_s`` and merges the other processes' here (:meth:`FleetShares.merge`); nothing of it
touches Redis on a request's path.

**Served** is the fleet-wide decayed dispatched cost of a flow divided by its weight. Before a
process hands a free slot of class ``c`` to one of its own waiters (or admits a request of
``c`` at once), :meth:`FleetShares.defer` asks whether another process has a better claim:

* a waiter of a higher class for the same model elsewhere (strict priority, fleet-wide), or
* a flow waiting elsewhere in ``(model, c)`` that is less served than the least served of the
  flows waiting here.

Then this process leaves the slot free for at most ``3 x interval_s`` (the time the others need
to see it free and take it: one publication, which :attr:`FleetShares.on_yield` asks for at once,
and one read); past that it dispatches its own
waiter, so a stale or unusable claim (the other process's waiter left, or its candidate set has
no room) wastes at most that long per slot. Within a process the order stays deficit round
robin (:mod:`gateway.flow.queues`): the fleet-wide view only decides which process serves.

Why dispatched cost and not in flight: with a class threshold of a few slots every flow holds
0 or 1 request in flight when a slot frees, so in-flight counts tie and the slot would stay with
the process where it freed, which is the process of the heavy key that keeps it busy.

The view is eventually consistent: the others' figures are as of their last publication (at
most about one ``interval_s`` old when read, another when this process's own change reaches
them). When Redis fails, the last merged figures are dropped after ``ttl_s`` and every process
judges fairness on its own queues, as without ``shared``.

Pure logic: no I/O; the caller passes the clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["FleetShares", "FlowKey", "Row"]

FlowKey = tuple[str, int, str]
"""``(model, class index, flow)``: whose share is counted."""

Row = tuple[str, int, str, float, int, float]
"""One published figure: ``(model, class index, flow, served cost, waiting, weight)``."""

_EPS = 1e-9


@dataclass(slots=True)
class _Decayed:
    value: float = 0.0
    at: float = 0.0

    def read(self, now: float, half_life_s: float) -> float:
        if now > self.at:
            self.value *= math.exp2(-(now - self.at) / half_life_s)
            self.at = now
        return self.value


@dataclass(slots=True)
class _Claim:
    served: float = 0.0
    waiting: int = 0
    weight: float = 1.0


class FleetShares:
    """This process's dispatched costs and the other processes' merged figures.

    Args:
        half_life_s: Half-life of the decayed dispatched cost, seconds.
        yield_s: Longest time a process leaves a slot to another's claim, seconds.
        ttl_s: Merged figures older than this are ignored, seconds (Redis failing).
        waiting: Returns this process's waiters as ``(model, class index, flow, waiters,
            weight)`` (called once per publication).
    """

    def __init__(self, *, half_life_s: float, yield_s: float, ttl_s: float,
                 waiting: Callable[[], Iterable[tuple[str, int, str, int, float]]]) -> None:
        self.half_life_s = half_life_s
        self.yield_s = yield_s
        self.ttl_s = ttl_s
        self._waiting = waiting
        self._served: dict[FlowKey, _Decayed] = {}
        self._peers: dict[FlowKey, _Claim] = {}
        self._merged_at: float | None = None
        self._yielding: dict[tuple[str, int], float] = {}
        self.deferred = 0  # slots left to another process's claim (for tests and reports)
        # Called when a process starts leaving a slot to another (FlowPeers publishes at once,
        # so the others see the slot free one round sooner).
        self.on_yield: Callable[[], None] | None = None

    # --- this process ---------------------------------------------------------------------

    def dispatched(self, key: FlowKey, cost: float, now: float) -> None:
        """Count ``cost`` dispatched for ``key`` (a request handed a replica)."""
        d = self._served.get(key)
        if d is None:
            d = self._served[key] = _Decayed(0.0, now)
        d.read(now, self.half_life_s)
        d.value += cost

    def rows(self, now: float) -> list[Row]:
        """What this process publishes: every flow it served recently or has waiting."""
        waiting: dict[FlowKey, tuple[int, float]] = {}
        for model, cls, flow, n, weight in self._waiting():
            if n > 0:
                key = (model, cls, flow)
                old = waiting.get(key, (0, weight))[0]
                waiting[key] = (old + n, weight)
        out: list[Row] = []
        for key in list(self._served):
            value = self._served[key].read(now, self.half_life_s)
            n, weight = waiting.pop(key, (0, 1.0))
            if value < 1e-3 and not n:
                del self._served[key]  # forgotten: decayed to nothing and not waiting
                continue
            out.append((*key, value, n, weight))
        out.extend((*key, 0.0, n, weight) for key, (n, weight) in waiting.items())
        return out

    # --- the other processes --------------------------------------------------------------

    def merge(self, rows: Iterable[object], now: float) -> None:
        """Replace the other processes' figures by the sum of ``rows`` (their published rows,
        as decoded from JSON; malformed rows are skipped)."""
        peers: dict[FlowKey, _Claim] = {}
        for row in rows:
            if not isinstance(row, list) or len(row) != 6:
                continue
            model, cls, flow, served, waiting, weight = row
            if not (isinstance(model, str) and isinstance(cls, int) and isinstance(flow, str)
                    and isinstance(served, (int, float)) and isinstance(waiting, int)
                    and isinstance(weight, (int, float)) and weight > 0):
                continue
            claim = peers.setdefault((model, cls, flow), _Claim(weight=float(weight)))
            claim.served += float(served)
            claim.waiting += waiting
            claim.weight = float(weight)
        self._peers = peers
        self._merged_at = now

    def _fresh(self, now: float) -> bool:
        return self._merged_at is not None and now - self._merged_at <= self.ttl_s

    def served(self, key: FlowKey, now: float) -> float:
        """Fleet-wide decayed dispatched cost of ``key`` (own now, the others' as published)."""
        own = self._served.get(key)
        mine = own.read(now, self.half_life_s) if own is not None else 0.0
        peer = self._peers.get(key) if self._fresh(now) else None
        return mine + (peer.served if peer is not None else 0.0)

    def peer_waiting(self, key: FlowKey, now: float) -> int:
        """Requests of ``key`` waiting in the other processes (0 when their figures are stale)."""
        peer = self._peers.get(key) if self._fresh(now) else None
        return peer.waiting if peer is not None else 0

    def claim(self, model: str, cls: int, local: dict[str, float], now: float) -> str | None:
        """Who elsewhere has a better claim on a slot of ``(model, cls)`` than the flows
        ``local`` (flow -> weight) waiting here, or ``None``.

        Returns:
            ``"priority"`` (a higher class waits elsewhere), ``"share"`` (a less served flow
            waits elsewhere) or ``None``.
        """
        if not self._peers or not self._fresh(now):
            return None
        best_remote = math.inf
        for (m, c, flow), peer in self._peers.items():
            if m != model or peer.waiting <= 0:
                continue
            if c < cls:
                return "priority"
            if c == cls:
                best_remote = min(best_remote,
                                  self.served((m, c, flow), now) / peer.weight)
        if best_remote == math.inf:
            return None
        best_local = min(self.served((model, cls, f), now) / w for f, w in local.items())
        return "share" if best_remote < best_local - _EPS else None

    def defer(self, model: str, cls: int, local: dict[str, float], now: float) -> bool:
        """True when this process should leave a free slot of ``(model, cls)`` to another
        process's claim (:meth:`claim`) now; never for longer than ``yield_s`` in a row."""
        where = (model, cls)
        if self.claim(model, cls, local, now) is None:
            self._yielding.pop(where, None)
            return False
        since = self._yielding.get(where)
        if since is None:
            since = self._yielding[where] = now
            if self.on_yield is not None:
                self.on_yield()
        if now - since <= self.yield_s:
            self.deferred += 1
            return True
        del self._yielding[where]  # the claim was not taken in time: serve our own
        return False
