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

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.asgi_io import ClientGone, Receive
from gateway.errors import GatewayError
from gateway.flow.errors import (
    FlowError,
    PriorityRaiseRefused,
    QueueFull,
    QueueTimeout,
    UnknownPriorityClass,
)
from gateway.flow.queues import ClassQueues, Waiter
from gateway.flow.saturation import with_room
from gateway.flow.settings import FlowControlSettings

if TYPE_CHECKING:
    from gateway.auth import Principal
    from gateway.fleet.scoring import RouteHint
    from gateway.records import RequestRecord
    from gateway.rewrite import ParsedBody
    from gateway.routing import Pool, Replica, Router

__all__ = ["FlowGate", "Lane", "to_gateway_error"]

_EWMA = 0.2  # weight of the newest wait in the per-class mean used for Retry-After


def to_gateway_error(exc: FlowError) -> GatewayError:
    """The gateway's OpenAI-shaped error for a flow-control error (same code, status, type)."""
    err = GatewayError(exc.message, code=exc.code, param=exc.param, headers=exc.headers())
    err.status = exc.status
    err.type = exc.error_type
    return err


@dataclass(eq=False, slots=True)
class _Hand:
    """What a queued request waits on: the replica handed over, and its routing hint."""

    future: asyncio.Future[Replica]
    hint: RouteHint | None


class _Group:
    """The queues of one model for one candidate set."""

    __slots__ = ("candidates", "queues")

    def __init__(self, candidates: Sequence[Replica], max_lens: Sequence[int]) -> None:
        self.candidates = tuple(candidates)
        self.queues: ClassQueues[_Hand] = ClassQueues(max_lens)


class _PoolFlow:
    """Flow control of one model: its pool and its queues by candidate set."""

    __slots__ = ("groups", "pool")

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.groups: dict[tuple[int, ...] | None, _Group] = {}

    def queued(self) -> bool:
        return any(len(g.queues) for g in self.groups.values())


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
        self.index = {c.name: i for i, c in enumerate(self.classes)}
        self.limits = tuple(settings.limits())
        self._max_lens = [c.max_queue for c in self.classes]
        self._default = self.index[settings.default_class]
        self._header = settings.header.encode("latin-1")
        self._by_team = settings.share_by == "team"
        self._vllm = frozenset(settings.vllm_priority_models)
        self.pools = {
            name: _PoolFlow(pool) for name, pool in router.pools.items() if settings.covers(name)
        }
        self.mean_wait_s = [1.0] * len(self.classes)
        self._retired: list[_PoolFlow] = []

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
        priority header may name a lower class.

        Raises:
            GatewayError: The header names a higher class (403 ``priority_raise_forbidden``)
                or no class (400 ``unknown_priority_class``).
        """
        flow = self.pools.get(pool.model.name)
        if flow is None:
            return None
        if flow.pool is not pool:  # routed with the snapshot before a live reload
            flow = self._retired_flow(pool)
        s = self.settings
        share = s.keys.get(principal.key_id)
        team = principal.team
        if share is None and team is not None:
            share = s.teams.get(team)
        cls = self.index[share.class_] if share is not None else self._default
        if self._by_team:
            who = team or principal.key_id
            team_share = s.teams.get(team) if team is not None else None
            weight = team_share.weight if team_share is not None else 1.0
        else:
            who = principal.key_id
            weight = share.weight if share is not None else 1.0
        named = [v.decode("latin-1") for n, v in headers if n == self._header]
        if named:
            cls = self._lowered(cls, named)
        if pool.model.name in self._vllm:
            configured = self.classes[cls].vllm_priority
            parsed.priority = configured if configured is not None else cls
        return Lane(self, flow, cls, who, weight, record)

    def _lowered(self, cls: int, fields: list[str]) -> int:
        header = self.settings.header
        # Several fields are one comma-separated list in HTTP (RFC 9110, 5.3): naming more
        # than one class is ambiguous, whatever the order, and refused.
        names = [part.strip().lower() for field in fields for part in field.split(",")]
        if len(names) > 1:
            err: FlowError = UnknownPriorityClass(
                f"The {header} header names more than one priority class "
                f"({', '.join(names)[:64]!r}); name one of: "
                f"{', '.join(c.name for c in self.classes)}.")
            err.param = header
            raise to_gateway_error(err)
        wanted = names[0]
        asked = self.index.get(wanted)
        if asked is None:
            err = UnknownPriorityClass(
                f"The {header} header names no priority class ({wanted[:64]!r}); classes: "
                f"{', '.join(c.name for c in self.classes)}.")
            err.param = header
            raise to_gateway_error(err)
        if asked < cls:
            err = PriorityRaiseRefused(
                f"The {header} header may only lower this key's priority class "
                f"({self.classes[cls].name!r}), not raise it to {wanted!r}.")
            err.param = header
            raise to_gateway_error(err)
        return asked

    # --- dispatch -------------------------------------------------------------------------

    def group(self, flow: _PoolFlow, candidates: Sequence[Replica]) -> _Group:
        """The queues of ``flow``'s model for ``candidates`` (created on first use)."""
        key = (None if len(candidates) == len(flow.pool.replicas)
               else tuple(r.index for r in candidates))
        group = flow.groups.get(key)
        if group is None:
            group = flow.groups[key] = _Group(candidates, self._max_lens)
        return group

    def dispatch(self, flow: _PoolFlow, group: _Group) -> None:
        """Hand replicas to waiters while some candidate has room (rules: module docstring)."""
        queues = group.queues
        now = self.clock()
        while True:
            cls = queues.top()
            if cls is None:
                return
            room = with_room(group.candidates, self.limits[cls], now, self.stale_s)
            if not room:
                return
            waiter = queues.pop(cls)
            hand = waiter.item
            replica = flow.pool.pick(room, hint=hand.hint)
            if replica is None:  # pragma: no cover - room is never empty here
                return
            replica.outstanding += 1  # reserved until the request's Lane.go()
            hand.future.set_result(replica)

    def kick(self, flow: _PoolFlow) -> None:
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

    def _retired_flow(self, pool: Pool) -> _PoolFlow:
        for flow in self._retired:
            if flow.pool is pool:
                return flow
        flow = _PoolFlow(pool)
        self._retired.append(flow)
        return flow

    def rebind(self, router: Router) -> None:
        """Cover the pools of a reloaded router (live reload; the ``flow_control`` section
        itself cannot change live).

        A model whose pool the new router kept keeps its queues. A model with a new pool starts
        with empty queues; the requests already queued on its old pool stay there and are
        dispatched onto the old pool's replicas (the decision they were admitted with) until
        none is left.
        """
        old = self.pools
        self.pools = {
            name: (old[name] if name in old and old[name].pool is pool else _PoolFlow(pool))
            for name, pool in router.pools.items() if self.settings.covers(name)
        }
        kept = set(map(id, self.pools.values()))
        self._retired += [f for f in old.values() if id(f) not in kept and f.queued()]

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


async def _disconnected(receive: Receive) -> None:
    """Return when the client disconnects (the body was read: nothing else arrives)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Lane:
    """One request's passage through flow control (see the module docstring for the order).

    Attributes:
        cls: Class index (0 is the highest).
        flow: The key id or team that shares the class fairly.
        weight: Its fair-share weight.
    """

    __slots__ = ("_flow", "_gate", "_group", "_reserved", "_waiter", "cls", "flow", "record",
                 "weight")

    def __init__(self, gate: FlowGate, flow: _PoolFlow, cls: int, who: str, weight: float,
                 record: RequestRecord) -> None:
        self._gate = gate
        self._flow = flow
        self.cls = cls
        self.flow = who
        self.weight = weight
        self.record = record
        self._reserved: Replica | None = None
        self._group: _Group | None = None
        self._waiter: Waiter[_Hand] | None = None

    @property
    def class_name(self) -> str:
        """The request's class."""
        return self._gate.classes[self.cls].name

    def admit(self, candidates: Sequence[Replica], hint: RouteHint | None) -> Replica | None:
        """A replica with room now (reserved), or ``None``: the request is queued.

        Raises:
            GatewayError: The class's queue is full (429 ``queue_full``, ``Retry-After``).
        """
        gate, flow = self._gate, self._flow
        group = gate.group(flow, candidates)
        now = gate.clock()
        if not group.queues.waiting_at_or_above(self.cls):
            room = with_room(candidates, gate.limits[self.cls], now, gate.stale_s)
            if room:
                replica = flow.pool.pick(room, hint=hint)
                if replica is not None:
                    replica.outstanding += 1
                    self._reserved = replica
                    self.record.flowed(self.class_name, "immediate", 0)
                    return replica
        hand = _Hand(asyncio.get_running_loop().create_future(), hint)
        waiter = Waiter(self.flow, self.weight, self.cls, now, hand)
        if not group.queues.push(waiter):
            self.record.flowed(self.class_name, "queue_full", 0)
            cls = gate.classes[self.cls]
            raise to_gateway_error(QueueFull(
                f"The fleet serving '{flow.pool.model.name}' is saturated and the queue of "
                f"class '{cls.name}' is full ({cls.max_queue} requests); retry later.",
                gate.mean_wait_s[self.cls]))
        self._group, self._waiter = group, waiter
        gate.dispatch(flow, group)
        return None

    async def wait(self, receive: Receive) -> Replica:
        """Wait for a replica with room (after :meth:`admit` returned ``None``).

        Raises:
            GatewayError: The class's ``max_wait_s`` passed (429 ``queue_timeout``).
            ClientGone: The client disconnected; the request left the queue at once.
        """
        gate, waiter, group = self._gate, self._waiter, self._group
        assert waiter is not None and group is not None
        future = waiter.item.future
        cls = gate.classes[self.cls]
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            if not future.done():
                left = cls.max_wait_s - (gate.clock() - waiter.enqueued_at)
                await asyncio.wait((future, gone), timeout=max(0.0, left),
                                   return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled (the drain deadline): leave the queue
            self._abandon(group, waiter)
            raise
        finally:
            gone.cancel()
        wait_s = gate.clock() - waiter.enqueued_at
        wait_ms = round(wait_s * 1000.0)
        if gone.done() and not gone.cancelled() and gone.exception() is None:
            self._abandon(group, waiter)
            self.record.flowed(cls.name, "client_disconnect", wait_ms)
            raise ClientGone()
        if future.done():
            self._reserved = future.result()
            gate.observe_wait(self.cls, wait_s)
            self.record.flowed(cls.name, "dispatched", wait_ms)
            return self._reserved
        group.queues.remove(waiter)
        self.record.flowed(cls.name, "queue_timeout", wait_ms)
        raise to_gateway_error(QueueTimeout(
            f"The fleet serving '{self._flow.pool.model.name}' stayed saturated for the "
            f"{cls.max_wait_s:g} s a '{cls.name}' request may wait; retry later.",
            gate.mean_wait_s[self.cls]))

    def _abandon(self, group: _Group, waiter: Waiter[_Hand]) -> None:
        """Leave the queue; give back a replica handed over in the meantime."""
        future = waiter.item.future
        if future.done():
            future.result().outstanding -= 1
            self._gate.kick(self._flow)
        else:
            group.queues.remove(waiter)
            future.cancel()

    def go(self) -> None:
        """The request is about to be forwarded: end the reservation (forward counts it)."""
        replica = self._reserved
        if replica is not None:
            replica.outstanding -= 1
            self._reserved = None

    def done(self) -> None:
        """The request ended (whatever the outcome): free a reservation, dispatch waiters."""
        self.go()
        if self._flow.queued():
            self._gate.kick(self._flow)

