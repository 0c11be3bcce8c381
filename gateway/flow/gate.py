"""The thin adapter between flow control and the relay: per-model queues, dispatch, lanes.

The relay asks :meth:`FlowGate.lane` for a request's :class:`Lane` (``None`` when flow control
does not cover the model) and then, in order::

    first = lane.admit(candidates, hint) or await lane.wait(receive)   # room now, or queue
    ... observers' on_start ...
    lane.go()                      # right before forward: forward counts the request itself
    ... forward ...
    lane.done()                    # always (finally): frees a reservation, dispatches waiters

Below saturation :meth:`Lane.admit` returns a replica at once (no await, no task, no future).
A replica handed out is *reserved* (its in-flight count raised) until :meth:`Lane.go`, so the
requests admitted while an earlier one is still being audited see the load it will add.

A replica handed out also counts the request in its class's in-flight count
(``Replica.flow_in_flight``) from the hand-over until :meth:`Lane.done`: the ``in_flight``
thresholds count the requests of a class and of the classes below it
(:mod:`gateway.flow.saturation`). A retry that the forwarder sends to another replica after a
failure stays counted on the replica it was handed (which failed; the retry is counted in the
other's ``outstanding`` like any request).

Dispatch runs when a request ends (:meth:`Lane.done`), after every scrape round of the
replicas' metrics (:meth:`FlowGate.kick_all`) and when a request is queued: per model and
candidate set, the highest class with a waiter is served while some candidate has room for it
(its thresholds, :mod:`gateway.flow.saturation`), by deficit round robin between the keys or
teams of the class (:mod:`gateway.flow.queues`); each dispatched request goes to a replica with
room, chosen by the pool's strategy (its routing hint included).

Requests with different candidate sets (the egress policy allows some keys fewer replicas)
queue separately; strict priority holds within each set.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from gateway.flow.classify import Classifier
from gateway.flow.errors import FlowError
from gateway.flow.fleetshare import FleetShares
from gateway.flow.lane import Group, Lane, PoolFlow, to_gateway_error
from gateway.flow.reserve import Reserve
from gateway.flow.saturation import with_room
from gateway.flow.settings import FlowControlSettings
from gateway.quotas.tokens import TokenEstimator

if TYPE_CHECKING:
    from gateway.auth import Principal
    from gateway.relay.records import RequestRecord
    from gateway.relay.rewrite import ParsedBody
    from gateway.routing import Pool, Replica, Router

__all__ = ["FlowGate", "Lane", "to_gateway_error"]

_EWMA = 0.2  # weight of the newest wait in the per-class mean used for Retry-After

class FlowGate:
    """Flow control of one gateway (built by the assembly when ``flow_control.enabled``).

    Args:
        settings: The ``flow_control`` section.
        router: The replica pools (the models it covers are taken from it).
        stale_s: Scraped replica metrics older than this are ignored, seconds
            (``routing.metrics_stale_s``).
        clock: Monotonic clock, seconds.
    """

    def __init__(
        self,
        settings: FlowControlSettings,
        router: Router,
        *,
        stale_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.stale_s = stale_s
        self.clock = clock
        self.classes = tuple(settings.classes)
        self.classifier = Classifier(settings)
        self.limits = tuple(settings.limits())
        self.workers = settings.processes  # whose sends the estimates count as this one's
        self._max_lens = [c.max_queue for c in self.classes]
        # Waiters one flow may hold per class (max_queue_share of max_queue, at least 1).
        self.flow_caps = [max(1, math.floor(c.max_queue_share * c.max_queue))
                          for c in self.classes]
        self._header = settings.header.encode("latin-1")
        self._vllm = frozenset(settings.vllm_priority_models)
        self.pools = {
            name: PoolFlow(pool) for name, pool in router.pools.items() if settings.covers(name)
        }
        self.mean_wait_s = [1.0] * len(self.classes)
        # Fair-share costs of queued requests (approximate token counts, no tokenizer).
        self._tokens = (TokenEstimator(completion_reserve_tokens=settings.default_max_tokens,
                                       completion_reserve_cap=1 << 40)
                        if settings.share_cost == "tokens" else None)
        self._retired: list[PoolFlow] = []
        # Replicas kept free of the lower classes (flow_control.reserve).
        reserve = settings.reserve
        self.reserve = (Reserve(reserve, [c.name for c in self.classes].index(
                            reserve.for_class or self.classes[0].name), self.limits,
                            stale_s, self.workers,
                            processes=1 if settings.shared is not None else self.workers)
                        if reserve is not None else None)
        # Bytes of the bodies of queued requests, and this worker's budget for them.
        self.queued_bytes = 0
        self.body_budget = max(1, settings.max_queued_body_bytes // settings.workers)
        # Fair shares across gateway processes (flow_control.shared.fair_share), fed by
        # gateway.flow.peers off the request path.
        shared = settings.shared
        self.shares = (FleetShares(half_life_s=shared.fair_half_life_s,
                                   yield_s=3 * shared.interval_s, ttl_s=shared.ttl_s,
                                   waiting=self.waiting)
                       if shared is not None and shared.fair_share else None)

    # --- per request ----------------------------------------------------------------------

    def lane(
        self,
        principal: Principal,
        pool: Pool,
        headers: Sequence[tuple[bytes, bytes]],
        parsed: ParsedBody,
        record: RequestRecord,
    ) -> Lane | None:
        """The lane of one request, or ``None`` when flow control does not cover its model.

        The class is the key's (``keys``), else its team's (``teams``), else the default; the
        priority header may name a lower class (:mod:`gateway.flow.classify`).

        Raises:
            GatewayError: The header names a higher class (403 ``priority_raise_forbidden``)
                or no class (400 ``unknown_priority_class``).
        """
        flow = self.pools.get(pool.model.name)
        if flow is None:
            return None
        if flow.pool is not pool:  # routed with the snapshot before a live reload
            flow = self._retired_flow(pool)
        named = [v.decode("latin-1") for n, v in headers if n == self._header]
        try:
            identity = principal.identity  # gateway.identity: a rule's flow_class
            cls, who, weight = self.classifier.classify(
                principal.key_id, principal.team, named,
                identity.flow_class if identity is not None else None)
        except FlowError as exc:
            raise to_gateway_error(exc) from None
        if pool.model.name in self._vllm:
            configured = self.classes[cls].vllm_priority
            parsed.priority = configured if configured is not None else cls
        return Lane(self, flow, cls, who, weight, record, parsed)

    # --- dispatch -------------------------------------------------------------------------

    def group(self, flow: PoolFlow, candidates: Sequence[Replica]) -> Group:
        """The queues of ``flow``'s model for ``candidates`` (created on first use)."""
        key = (None if len(candidates) == len(flow.pool.replicas)
               else tuple(r.index for r in candidates))
        group = flow.groups.get(key)
        if group is None:
            group = flow.groups[key] = Group(candidates, self._max_lens)
        return group

    def dispatch(self, flow: PoolFlow, group: Group) -> None:
        """Hand replicas to waiters while some candidate has room (rules: module docstring)."""
        queues = group.queues
        now = self.clock()
        while True:
            cls = queues.top()
            if cls is None:
                return
            room = self.room(flow, group.candidates, cls, now)
            if not room:
                return
            shares = self.shares
            model = flow.pool.model.name
            if shares is not None and shares.defer(model, cls, queues.classes[cls].weights(),
                                                   now):
                return  # another process has the better claim (gateway.flow.fleetshare)
            waiter = queues.pop(cls)
            if shares is not None:
                shares.dispatched((model, cls, waiter.flow), waiter.cost, now)
            hand = waiter.item
            replica = flow.pool.pick(room, hint=hand.hint)
            if replica is None:  # pragma: no cover - room is never empty here
                return
            self.hold(replica, cls)
            hand.future.set_result(replica)

    def room(self, flow: PoolFlow, candidates: Sequence[Replica], cls: int,
             now: float) -> Sequence[Replica]:
        """The candidates a request of class ``cls`` of ``flow``'s model may be handed now:
        those with room for the class (:mod:`gateway.flow.saturation`), narrowed by the
        reserve when there is one (:mod:`gateway.flow.reserve`); empty when none."""
        reserve = self.reserve
        if reserve is None or not reserve.covers(flow.pool.model.name):
            return with_room(candidates, cls, self.limits[cls], now, self.stale_s,
                             self.workers)
        waiting = any(g.queues.waiting_at_or_above(reserve.cls) for g in flow.groups.values())
        return reserve.room(flow.reserve, candidates, cls, waiting, now)

    def settle(self, flow: PoolFlow) -> None:
        """A request of ``flow``'s model ended: the reserve notes the demand, so that its
        ``hold_s`` counts from when the demand fell (nothing to do without a reserve)."""
        reserve = self.reserve
        if reserve is not None and reserve.covers(flow.pool.model.name):
            waiting = any(g.queues.waiting_at_or_above(reserve.cls)
                          for g in flow.groups.values())
            reserve.update(flow.reserve, flow.pool.replicas, waiting, self.clock())

    def reserve_rows(self) -> list[tuple[str, int, int]]:
        """``(model, widened 0/1, demand)`` per model under a reserve (the metrics gauges)."""
        reserve = self.reserve
        if reserve is None:
            return []
        return [(model, int(flow.reserve.widened), flow.reserve.demand)
                for model, flow in self.pools.items() if reserve.covers(model)]

    def hold(self, replica: Replica, cls: int) -> None:
        """Hand ``replica`` to a request of class ``cls``: reserve it (``outstanding``, until
        :meth:`Lane.go`) and count the request in its class (until :meth:`Lane.done`)."""
        replica.outstanding += 1
        held = replica.flow_in_flight
        if not held:
            held.extend([0] * len(self.classes))
        held[cls] += 1

    def waiting(self) -> list[tuple[str, int, str, int, float]]:
        """``(model, class index, flow, waiters, weight)`` per flow with a waiter (summed over
        candidate sets; what :class:`FleetShares` publishes)."""
        out: list[tuple[str, int, str, int, float]] = []
        for flow in (*self.pools.values(), *self._retired):
            model = flow.pool.model.name
            for group in flow.groups.values():
                for cls, queue in enumerate(group.queues.classes):
                    if len(queue):
                        weights = queue.weights()
                        out.extend((model, cls, who, n, weights[who])
                                   for who, n in queue.flows().items())
        return out

    def kick(self, flow: PoolFlow) -> None:
        """Dispatch the waiters of one model (a request ended)."""
        for group in tuple(flow.groups.values()):
            if len(group.queues):
                self.dispatch(flow, group)

    def kick_all(self) -> None:
        """Dispatch the waiters of every model (a scrape round stored new figures)."""
        for flow in self.pools.values():
            if flow.queued():
                self.kick(flow)
        if self._retired:
            for flow in self._retired:
                self.kick(flow)
            self._retired = [f for f in self._retired if f.queued()]

    def _retired_flow(self, pool: Pool) -> PoolFlow:
        for flow in self._retired:
            if flow.pool is pool:
                return flow
        flow = PoolFlow(pool)
        self._retired.append(flow)
        return flow

    def reconfigure(self, settings: FlowControlSettings) -> None:
        """Classify new requests by a reloaded section's per-key and per-team overrides.

        ``flow_control.keys`` and ``flow_control.teams`` are the only part of the section a
        live reload may change (:data:`gateway.serving.reload.RELOADABLE`); a request already
        admitted
        or queued keeps the class and weight it was classified with.

        Args:
            settings: The reloaded ``flow_control`` section (as this worker's share of it).
        """
        self.settings = settings
        self.classifier = Classifier(settings)

    def rebind(self, router: Router) -> None:
        """Cover the pools of a reloaded router (live reload; of the ``flow_control`` section
        only the per-key and per-team overrides change live, see :meth:`reconfigure`).

        A model whose pool the new router kept keeps its queues. A model with a new pool starts
        with empty queues; the requests already queued on its old pool stay there and are
        dispatched onto the old pool's replicas (the decision they were admitted with) until
        none is left.
        """
        old = self.pools
        self.pools = {
            name: (old[name] if name in old and old[name].pool is pool else PoolFlow(pool))
            for name, pool in router.pools.items() if self.settings.covers(name)
        }
        kept = set(map(id, self.pools.values()))
        self._retired += [f for f in old.values() if id(f) not in kept and f.queued()]

    def cost(self, parsed: ParsedBody) -> float:
        """What a queued request costs its flow in its class's fair share (``share_cost``):
        its estimated prompt tokens plus its maximum completion tokens, or 1 (at least 1)."""
        if self._tokens is None:
            return 1.0
        return float(max(1, self._tokens.estimate(parsed.model, parsed.values).total))

    def observe_wait(self, cls: int, wait_s: float) -> None:
        """Fold a dispatched request's wait into its class's mean (for ``Retry-After``)."""
        self.mean_wait_s[cls] += _EWMA * (wait_s - self.mean_wait_s[cls])

    def queue_lengths(self) -> list[tuple[str, str, int]]:
        """``(model, class, waiters)`` for every covered model and class (the metrics gauge)."""
        rows: list[tuple[str, str, int]] = []
        for model, flow in self.pools.items():
            totals = [0] * len(self.classes)
            for group in flow.groups.values():
                for i, n in enumerate(group.queues.lengths()):
                    totals[i] += n
            rows.extend((model, c.name, totals[i]) for i, c in enumerate(self.classes))
        return rows
