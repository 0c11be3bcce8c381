"""One request's passage through flow control (:class:`Lane`) and the queues it waits in.

The order of the calls and the rules are in :mod:`gateway.flow.gate`, which builds the lanes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gateway.errors import GatewayError
from gateway.flow.errors import (
    BodyOverQueueBudget,
    FlowError,
    FlowShareFull,
    QueueBytesFull,
    QueueFull,
    QueueTimeout,
)
from gateway.flow.fleetshare import FleetShares
from gateway.flow.queues import ClassQueues, Waiter
from gateway.flow.reserve import ReserveState
from gateway.flow.settings import FlowClassSettings, SaturationSettings
from gateway.h1.asgi_io import ClientGone, Receive

if TYPE_CHECKING:
    from gateway.fleet.scoring import RouteHint
    from gateway.relay.records import RequestRecord
    from gateway.relay.rewrite import ParsedBody
    from gateway.routing import Pool, Replica

__all__ = ["Group", "Lane", "LaneGate", "PoolFlow", "to_gateway_error"]


class LaneGate(Protocol):
    """What a :class:`Lane` uses of its gate (:class:`gateway.flow.gate.FlowGate` has it)."""

    classes: tuple[FlowClassSettings, ...]
    limits: tuple[SaturationSettings, ...]
    flow_caps: list[int]
    mean_wait_s: list[float]
    body_budget: int
    queued_bytes: int
    stale_s: float
    workers: int
    shares: FleetShares | None

    def clock(self) -> float:
        """Monotonic time, seconds."""
        ...

    def cost(self, parsed: ParsedBody) -> float:
        """A queued request's fair-share cost."""
        ...

    def group(self, flow: PoolFlow, candidates: Sequence[Replica]) -> Group:
        """The queues of ``flow``'s model for ``candidates``."""
        ...

    def dispatch(self, flow: PoolFlow, group: Group) -> None:
        """Hand replicas to waiters while some candidate has room."""
        ...

    def room(self, flow: PoolFlow, candidates: Sequence[Replica], cls: int,
             now: float) -> Sequence[Replica]:
        """The candidates a request of class ``cls`` may be handed now (empty: none)."""
        ...

    def hold(self, replica: Replica, cls: int) -> None:
        """Reserve ``replica`` for a request of class ``cls``."""
        ...

    def kick(self, flow: PoolFlow) -> None:
        """Dispatch the waiters of one model."""
        ...

    def settle(self, flow: PoolFlow) -> None:
        """A request of ``flow``'s model ended: let its reserve note the lower demand."""
        ...

    def observe_wait(self, cls: int, wait_s: float) -> None:
        """Fold one queue wait into the class's mean."""
        ...


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


class Group:
    """The queues of one model for one candidate set."""

    __slots__ = ("candidates", "queues")

    def __init__(self, candidates: Sequence[Replica], max_lens: Sequence[int]) -> None:
        self.candidates = tuple(candidates)
        self.queues: ClassQueues[_Hand] = ClassQueues(max_lens)


class PoolFlow:
    """Flow control of one model: its pool, its queues by candidate set, and the state of its
    reserve (``flow_control.reserve``, :mod:`gateway.flow.reserve`)."""

    __slots__ = ("groups", "pool", "reserve")

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.groups: dict[tuple[int, ...] | None, Group] = {}
        self.reserve = ReserveState()

    def queued(self) -> bool:
        """True when a request of this model waits in any of its queues."""
        return any(len(g.queues) for g in self.groups.values())


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

    __slots__ = ("_bytes", "_flow", "_gate", "_group", "_held", "_parsed", "_reserved",
                 "_waiter", "cls", "flow", "record", "weight")

    def __init__(self, gate: LaneGate, flow: PoolFlow, cls: int, who: str, weight: float,
                 record: RequestRecord, parsed: ParsedBody) -> None:
        self._gate = gate
        self._flow = flow
        self.cls = cls
        self.flow = who
        self.weight = weight
        self.record = record
        self._parsed = parsed  # for its fair-share cost, estimated only if it has to wait
        self._reserved: Replica | None = None
        self._held: Replica | None = None  # counted in its class's in-flight count there
        self._group: Group | None = None
        self._waiter: Waiter[_Hand] | None = None
        self._bytes = 0  # body bytes counted in the gate's queued bytes while it waits

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
        shares, model = gate.shares, flow.pool.model.name
        if not group.queues.waiting_at_or_above(self.cls):
            room = gate.room(flow, candidates, self.cls, now)
            if room and shares is not None and shares.defer(model, self.cls,
                                                            {self.flow: self.weight}, now):
                room = ()  # another process has the better claim: wait behind it
            if room:
                replica = flow.pool.pick(room, hint=hint)
                if replica is not None:
                    if shares is not None:
                        shares.dispatched((model, self.cls, self.flow),
                                          gate.cost(self._parsed), now)
                    gate.hold(replica, self.cls)
                    self._reserved = self._held = replica
                    self.record.flowed(self.class_name, "immediate", 0)
                    return replica
        hand = _Hand(asyncio.get_running_loop().create_future(), hint)
        waiter = Waiter(self.flow, self.weight, self.cls, now, hand, gate.cost(self._parsed))
        queue = group.queues.classes[self.cls]
        cap = gate.flow_caps[self.cls]
        # With fair_share the key's waiters in the other processes count too (as published).
        held = queue.flow_len(self.flow) + (
            shares.peer_waiting((model, self.cls, self.flow), now) if shares is not None else 0)
        if len(queue) < queue.max_len and held >= cap:
            self.record.flowed(self.class_name, "flow_queue_full", 0)
            cls = gate.classes[self.cls]
            raise to_gateway_error(FlowShareFull(
                f"The fleet serving '{flow.pool.model.name}' is saturated and this key already "
                f"holds its share of the queue of class '{cls.name}' ({cap} of "
                f"{cls.max_queue} requests, max_queue_share {cls.max_queue_share}); retry "
                "later.", gate.mean_wait_s[self.cls]))
        size = len(self._parsed.raw)
        if size > gate.body_budget:
            self.record.flowed(self.class_name, "body_exceeds_queue_budget", 0)
            raise to_gateway_error(BodyOverQueueBudget(
                f"The fleet serving '{flow.pool.model.name}' is saturated and this request's "
                f"body ({size} bytes) is larger than the byte budget for queued requests "
                f"(max_queued_body_bytes: {gate.body_budget} bytes here), so it cannot wait; "
                "send a smaller request or retry when the fleet has room."))
        if gate.queued_bytes + size > gate.body_budget:
            self.record.flowed(self.class_name, "queue_bytes_full", 0)
            raise to_gateway_error(QueueBytesFull(
                f"The fleet serving '{flow.pool.model.name}' is saturated and the queued "
                f"requests' bodies already hold {gate.queued_bytes} of the "
                f"{gate.body_budget} bytes queued bodies may hold (max_queued_body_bytes); "
                "retry later.", gate.mean_wait_s[self.cls]))
        if not group.queues.push(waiter):
            self.record.flowed(self.class_name, "queue_full", 0)
            cls = gate.classes[self.cls]
            raise to_gateway_error(QueueFull(
                f"The fleet serving '{flow.pool.model.name}' is saturated and the queue of "
                f"class '{cls.name}' is full ({cls.max_queue} requests); retry later.",
                gate.mean_wait_s[self.cls]))
        self._group, self._waiter = group, waiter
        self._bytes = size
        gate.queued_bytes += size
        # Its values were read (cost, route hint, admission hooks): while it waits it holds
        # its body once, the bytes; the values are parsed again if read after the wait.
        self._parsed.shed()
        gate.dispatch(flow, group)
        return None

    async def wait(self, receive: Receive) -> Replica:
        """Wait for a replica with room (after :meth:`admit` returned ``None``).

        Raises:
            GatewayError: The class's ``max_wait_s`` passed (429 ``queue_timeout``).
            ClientGone: The client disconnected; the request left the queue at once.
        """
        try:
            return await self._wait(receive)
        finally:
            # Out of the queue, whatever happened: its body no longer counts as queued.
            self._gate.queued_bytes -= self._bytes
            self._bytes = 0

    async def _wait(self, receive: Receive) -> Replica:
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
            self._reserved = self._held = future.result()
            gate.observe_wait(self.cls, wait_s)
            self.record.flowed(cls.name, "dispatched", wait_ms)
            return self._reserved
        group.queues.remove(waiter)
        self.record.flowed(cls.name, "queue_timeout", wait_ms)
        raise to_gateway_error(QueueTimeout(
            f"The fleet serving '{self._flow.pool.model.name}' stayed saturated for the "
            f"{cls.max_wait_s:g} s a '{cls.name}' request may wait; retry later.",
            gate.mean_wait_s[self.cls]))

    def _abandon(self, group: Group, waiter: Waiter[_Hand]) -> None:
        """Leave the queue; give back a replica handed over in the meantime."""
        future = waiter.item.future
        if future.done():
            replica = future.result()
            replica.outstanding -= 1
            replica.flow_in_flight[self.cls] -= 1
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
        """The request ended (whatever the outcome): free a reservation and its class's slot,
        dispatch waiters."""
        self.go()
        held = self._held
        if held is not None:
            held.flow_in_flight[self.cls] -= 1
            self._held = None
        self._gate.settle(self._flow)
        if self._flow.queued():
            self._gate.kick(self._flow)

