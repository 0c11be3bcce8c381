"""A reserve of replicas kept free of the lower classes (``flow_control.reserve``).

Per model, the first ``replicas`` available candidates in pool order (the same replicas in
every gateway process, since all read the same config and judge health the same way) are the
**reserve**. While the reserve is *narrow*:

* requests of the reserve's class (``for_class``) and the classes above it go to a reserved
  replica with room for them when there is one (otherwise to any replica with room);
* requests of the classes below never go to a reserved replica, neither for their prefill nor
  for their decode: an interactive arrival then finds an engine whose step holds interactive
  work only. On the other replicas they may use the thresholds of the reserve's class
  (``lift``), counted over the reserve's class and every class below it, so batch keeps the
  slots it gave up on the reserve: with batch ``in_flight`` 4 of 8 on each of two replicas,
  batch holds 8 of 8 on the one replica left to it. With ``lower_in_flight`` N, once the other
  replicas are full for them, each reserved replica takes up to N of them (within their own
  thresholds): for engines that chunk long prompts finely enough that the chunks ride in the
  steps the reserve's classes run anyway. With ``lower_busy_s`` S (default 5) a reserved
  replica does so only once the reserve's classes have kept it busy (one of their requests in
  flight there, without a gap, as seen at this process's decisions) for S seconds: on a
  reserve that is idle between their requests, a lower-class request would itself make the
  step the next arrival waits for.

The reserve **widens** (every replica serves every class with its own thresholds, exactly as
without a reserve) when the demand of the reserve's classes reaches ``widen_at`` of its
capacity or one of their requests waits in the gateway's queue, and **shrinks** back once the
demand has stayed at or below ``shrink_at`` of it for ``hold_s`` seconds (hysteresis).
*Demand* is the requests of the reserve's class and the classes above it in flight on every
candidate of the model (this process's, plus the other processes' with
``flow_control.shared``); *capacity* is ``replicas x`` the reserve class's ``in_flight``
threshold as this process enforces it (or ``reserve.in_flight``). A pool with no more
available candidates than ``replicas`` has no reserve.

Pure logic over the replicas' counts, called on the admission and dispatch paths (no I/O).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from gateway.flow.saturation import ReplicaLoad, has_room, with_room
from gateway.flow.settings import ReserveSettings, SaturationSettings

__all__ = ["ReservableReplica", "Reserve", "ReserveState"]


class ReservableReplica(ReplicaLoad, Protocol):
    """What the reserve reads of a replica (``gateway.routing.Replica`` has it)."""

    @property
    def index(self) -> int:
        """Position in the pool (stable): the reserve is the first available ones."""
        ...

    def available(self, now: float) -> bool:
        """True when the replica is neither ejected nor failing its active probe."""
        ...


Replica = TypeVar("Replica", bound=ReservableReplica)

_log = logging.getLogger(__name__)


@dataclass(slots=True)
class ReserveState:
    """The reserve of one model (one per :class:`gateway.flow.lane.PoolFlow`).

    Attributes:
        widened: True while every replica serves every class.
        calm_since: Monotonic time (s) since which the demand has stayed at or below
            ``shrink_at`` of the capacity while widened (``None``: it has not).
        widenings: Times the reserve widened since start (for metrics).
        demand: The demand at the last decision, requests.
        busy_since: Per replica index, the monotonic time (s) since which requests of the
            reserve's classes have been in flight on it without a gap, as seen at the
            decisions (kept only with ``lower_in_flight`` and ``lower_busy_s``).
    """

    widened: bool = False
    calm_since: float | None = None
    widenings: int = 0
    demand: int = 0
    busy_since: dict[int, float] = field(default_factory=dict)


class Reserve:
    """The reserve's decisions for one gateway process.

    Args:
        settings: ``flow_control.reserve``.
        cls: Index of the reserve's class (``for_class``; 0 is the highest).
        limits: The thresholds this process enforces per class
            (:meth:`~gateway.flow.settings.FlowControlSettings.limits`).
        stale_s: Scraped figures older than this are ignored, seconds.
        workers: Gateway processes whose sends the estimates count as this one's.
        processes: Processes that split ``reserve.in_flight`` between them (``pods x workers``;
            1 with ``flow_control.shared``, where the demand counts every process's requests).

    Raises:
        ValueError: No capacity can be derived: neither ``reserve.in_flight`` nor an
            ``in_flight`` threshold of the reserve's class.
    """

    def __init__(self, settings: ReserveSettings, cls: int,
                 limits: Sequence[SaturationSettings], stale_s: float, workers: int,
                 processes: int = 1) -> None:
        self.settings = settings
        self.cls = cls
        self._limits = tuple(limits)
        self._stale_s = stale_s
        self._workers = workers
        per_replica = settings.in_flight
        if per_replica is None:
            per_replica = self._limits[cls].in_flight
        elif processes > 1:
            per_replica = max(1, per_replica // processes)
        if per_replica is None:
            raise ValueError("reserve.in_flight: not set and the reserve's class has no "
                             "in_flight threshold to size the reserve by")
        self.capacity = settings.replicas * per_replica
        # Lower-class requests one reserved replica takes while narrow (this process's part).
        self.lower_in_flight = settings.lower_in_flight // max(1, processes)

    def covers(self, model: str) -> bool:
        """True when the reserve applies to the model ``model`` (``reserve.models``)."""
        return not self.settings.models or model in self.settings.models

    def split(self, candidates: Sequence[Replica], now: float
              ) -> tuple[list[Replica], list[Replica]]:
        """``(reserved, others)`` of ``candidates``: the first ``replicas`` available ones in
        pool order, and the rest (``([], candidates)`` when that leaves no other)."""
        ordered = sorted(candidates, key=lambda r: r.index)
        reserved = [r for r in ordered if r.available(now)][: self.settings.replicas]
        others = [r for r in ordered if r not in reserved]
        if len(reserved) < self.settings.replicas or not [r for r in others
                                                          if r.available(now)]:
            return [], list(candidates)
        return reserved, others

    def update(self, state: ReserveState, candidates: Sequence[ReservableReplica],
               waiting: bool, now: float) -> None:
        """Widen or shrink ``state`` from the demand on ``candidates`` (module docstring).

        Args:
            state: The model's reserve state (changed in place).
            candidates: The model's candidate replicas.
            waiting: A request of the reserve's class or above waits in the gateway.
            now: Monotonic time, seconds.
        """
        top = self.cls + 1
        demand = 0
        streaks = (state.busy_since if self.lower_in_flight
                   and self.settings.lower_busy_s is not None else None)
        for r in candidates:
            mine = sum(r.flow_in_flight[:top]) + sum(r.peer_in_flight[:top])
            demand += mine
            if streaks is not None:
                if mine:
                    streaks.setdefault(r.index, now)
                else:
                    streaks.pop(r.index, None)
        state.demand = demand
        cfg = self.settings
        if not state.widened:
            if waiting or demand >= cfg.widen_at * self.capacity:
                state.widened, state.calm_since = True, None
                state.widenings += 1
                _log.info("flow reserve widened: %d requests of the reserve's classes in "
                          "flight (capacity %d)%s", demand, self.capacity,
                          ", some waiting" if waiting else "")
            return
        if waiting or demand > cfg.shrink_at * self.capacity:
            state.calm_since = None
        elif state.calm_since is None:
            state.calm_since = now
        elif now - state.calm_since >= cfg.hold_s:
            state.widened, state.calm_since = False, None
            _log.info("flow reserve narrowed: %d requests of the reserve's classes in flight "
                      "for %.1f s (capacity %d)", demand, cfg.hold_s, self.capacity)

    def room(self, state: ReserveState, candidates: Sequence[Replica], cls: int,
             waiting: bool, now: float) -> Sequence[Replica]:
        """The replicas a request of class ``cls`` may be handed now (empty: none has room).

        Args:
            state: The model's reserve state (updated first, see :meth:`update`).
            candidates: The request's candidate replicas.
            cls: The request's class index.
            waiting: A request of the reserve's class or above waits in the gateway.
            now: Monotonic time, seconds.
        """
        self.update(state, candidates, waiting, now)
        limits = self._limits

        def plain(rs: Sequence[Replica]) -> Sequence[Replica]:
            return with_room(rs, cls, limits[cls], now, self._stale_s, self._workers)

        if state.widened:
            return plain(candidates)
        reserved, others = self.split(candidates, now)
        if not reserved:
            return plain(candidates)
        if cls <= self.cls:
            mine = [r for r in reserved
                    if has_room(r, cls, limits[cls], now, self._stale_s, self._workers)]
            return mine or plain(others)
        top = self.cls
        if not self.settings.lift:
            room = plain(others)
        else:
            room = [r for r in others
                    if has_room(r, top, limits[top], now, self._stale_s, self._workers)]
        if room or not self.lower_in_flight:
            return room
        # The others are full for the lower classes: a reserved replica takes a few of them
        # (``lower_in_flight``), within their own thresholds and the reserve class's.
        return [r for r in reserved
                if self._kept_busy(state, r, now)
                and self._lower_count(r) < self.lower_in_flight
                and has_room(r, cls, limits[cls], now, self._stale_s, self._workers)
                and has_room(r, top, limits[top], now, self._stale_s, self._workers)]

    def _kept_busy(self, state: ReserveState, replica: ReservableReplica, now: float) -> bool:
        """True when ``replica`` may take lower-class requests by ``lower_busy_s``: it is not
        set, or the reserve's classes have kept the replica busy for that long."""
        busy_s = self.settings.lower_busy_s
        if busy_s is None:
            return True
        since = state.busy_since.get(replica.index)
        return since is not None and now - since >= busy_s

    def _lower_count(self, replica: ReservableReplica) -> int:
        """Requests of the classes below the reserve's in flight to ``replica`` (every
        process's with ``shared``)."""
        low = self.cls + 1
        return sum(replica.flow_in_flight[low:]) + sum(replica.peer_in_flight[low:])
