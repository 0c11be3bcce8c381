"""Bounded per-class queues: strict priority between classes, deficit round robin within one.

Pure logic, no I/O and no clock: the caller stamps waiters and decides when to dispatch.

* **Between classes**: strict priority. :meth:`ClassQueues.top` is the highest class with a
  waiter; a lower class is served only when every higher one is empty.
* **Within a class**: deficit round robin over *flows* (a key, or a team), after Shreedhar and
  Varghese, "Efficient fair queuing using deficit round robin", SIGCOMM 1995, with a request's
  ``cost`` in the place of the packet size (one unit per request, or the request's estimated
  tokens: the caller decides) and a flow's weight as its quantum. When a flow reaches the head
  of the round it gains its weight in credit and is served while its credit covers the cost of
  its first request; an emptied flow leaves the round and loses its credit. Over a busy
  period, flows with weights *w1* and *w2* are served costs in the ratio *w1 : w2* (within one
  request per flow), whatever their arrival rates, so a heavy key cannot starve a light one,
  and with token costs a key sending long requests gets proportionally fewer of them.
  A quantum smaller than the costs only takes more rounds: a whole round in which no flow can
  be served is followed by the empty rounds that would come next in one step (each flow gains
  its quantum that many times), so a pop costs O(flows) whatever the costs.
* **Bounds**: each class holds at most ``max_len`` waiters (:meth:`ClassQueue.push` refuses
  one more); a waiter can leave from anywhere (:meth:`ClassQueue.remove`: timeout, disconnect).

Costs: push O(1); pop O(1) when the first flow visited can be served, else at most two rounds
over the waiting flows; remove O(waiters of that flow).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

__all__ = ["ClassQueue", "ClassQueues", "Waiter"]

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Waiter(Generic[T]):
    """One queued request.

    Attributes:
        flow: Who shares fairly: a key id or a team name.
        weight: The flow's quantum (> 0).
        cls: Class index (0 is the highest priority).
        enqueued_at: When it was queued, seconds on the caller's clock.
        item: The caller's payload (the request's hand-over).
        cost: What serving it costs its flow's credit (> 0): 1 per request, or its
            estimated tokens.
    """

    flow: str
    weight: float
    cls: int
    enqueued_at: float
    item: T
    cost: float = 1.0


@dataclass(eq=False, slots=True)
class _Flow(Generic[T]):
    name: str
    weight: float
    items: deque[Waiter[T]] = field(default_factory=deque)
    deficit: float = 0.0


class ClassQueue(Generic[T]):
    """The waiters of one class, served by deficit round robin between flows.

    Args:
        max_len: Waiters the class may hold (0: the class never queues).
    """

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self._flows: dict[str, _Flow[T]] = {}
        self._round: deque[_Flow[T]] = deque()
        self._current: _Flow[T] | None = None
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, waiter: Waiter[T]) -> bool:
        """Queue ``waiter`` at the end of its flow; ``False`` (nothing changed) when full."""
        if self._len >= self.max_len:
            return False
        flow = self._flows.get(waiter.flow)
        if flow is None:
            flow = _Flow(waiter.flow, waiter.weight)
            self._flows[waiter.flow] = flow
            self._round.append(flow)
        flow.weight = waiter.weight  # the latest configuration wins
        flow.items.append(waiter)
        self._len += 1
        return True

    def pop(self) -> Waiter[T]:
        """The next waiter by deficit round robin.

        Raises:
            IndexError: The class is empty.
        """
        if not self._len:
            raise IndexError("pop from an empty class queue")
        missed = 0
        while True:
            flow = self._current
            if flow is None:
                flow = self._round.popleft()
                flow.deficit += flow.weight
                self._current = flow
            cost = flow.items[0].cost
            if flow.deficit >= cost:
                flow.deficit -= cost
                waiter = flow.items.popleft()
                self._len -= 1
                if not flow.items:
                    self._drop(flow)
                return waiter
            self._current = None
            self._round.append(flow)
            missed += 1
            if missed >= len(self._round):  # a whole round and nobody could be served
                self._skip_empty_rounds()
                missed = 0

    def _skip_empty_rounds(self) -> None:
        """Credit every flow with the empty rounds that would follow, all at once: the rounds
        before the first flow whose credit would cover its first request's cost."""
        rounds = min(math.ceil((f.items[0].cost - f.deficit) / f.weight) for f in self._round)
        if rounds > 1:
            for f in self._round:
                f.deficit += (rounds - 1) * f.weight

    def remove(self, waiter: Waiter[T]) -> bool:
        """Take ``waiter`` out wherever it is; ``False`` when it is not queued (any more)."""
        flow = self._flows.get(waiter.flow)
        if flow is None:
            return False
        try:
            flow.items.remove(waiter)
        except ValueError:
            return False
        self._len -= 1
        if not flow.items:
            if flow is not self._current:
                self._round.remove(flow)
            self._drop(flow)
        return True

    def _drop(self, flow: _Flow[T]) -> None:
        """An emptied flow leaves the round and loses its credit (DRR)."""
        del self._flows[flow.name]
        flow.deficit = 0.0
        if flow is self._current:
            self._current = None

    def flow_len(self, name: str) -> int:
        """Waiters of flow ``name`` in this class."""
        flow = self._flows.get(name)
        return 0 if flow is None else len(flow.items)

    def flows(self) -> dict[str, int]:
        """Waiters per flow (for reports and tests)."""
        return {name: len(flow.items) for name, flow in self._flows.items()}

    def weights(self) -> dict[str, float]:
        """The weight of each flow with a waiter."""
        return {name: flow.weight for name, flow in self._flows.items()}


class ClassQueues(Generic[T]):
    """One :class:`ClassQueue` per class, highest priority first.

    Args:
        max_lens: ``max_len`` of each class, in class order.
    """

    def __init__(self, max_lens: Sequence[int]) -> None:
        self.classes = [ClassQueue[T](n) for n in max_lens]
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def push(self, waiter: Waiter[T]) -> bool:
        """Queue ``waiter`` in its class; ``False`` when that class is full."""
        if self.classes[waiter.cls].push(waiter):
            self._len += 1
            return True
        return False

    def top(self) -> int | None:
        """The highest class with a waiter, or ``None`` when all are empty."""
        if not self._len:
            return None
        for i, queue in enumerate(self.classes):
            if len(queue):
                return i
        return None  # pragma: no cover - _len counts the waiters of the classes

    def waiting_at_or_above(self, cls: int) -> bool:
        """True when a waiter of class ``cls`` or a higher one is queued."""
        return bool(self._len) and any(len(q) for q in self.classes[: cls + 1])

    def pop(self, cls: int) -> Waiter[T]:
        """The next waiter of class ``cls`` (deficit round robin among its flows).

        Raises:
            IndexError: That class is empty.
        """
        waiter = self.classes[cls].pop()
        self._len -= 1
        return waiter

    def remove(self, waiter: Waiter[T]) -> bool:
        """Take ``waiter`` out; ``False`` when it was not queued."""
        if self.classes[waiter.cls].remove(waiter):
            self._len -= 1
            return True
        return False

    def lengths(self) -> list[int]:
        """Waiters per class, in class order."""
        return [len(q) for q in self.classes]
