"""The engine's waiting queue under vLLM's two scheduling policies (``--scheduling-policy``).

vLLM V1 (``vllm/v1/core/sched/request_queue.py``) keeps waiting requests in one of:

* ``fcfs`` (the default): arrival order; a preempted request goes back to the *front*.
* ``priority``: ordered by ``(priority, arrival)``, a lower ``priority`` value first, equal
  values in arrival order; "prepending" a preempted request just inserts it at its place in
  that order (a priority queue has no front to put it at).

A request's ``priority`` is the body field of the same name (default 0); vLLM refuses a
non-zero value unless the engine runs ``--scheduling-policy priority``
(:func:`vllm_sim.protocol.parse_priority`).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator
from typing import Generic, Literal, Protocol, TypeVar

__all__ = ["Queued", "SchedulingPolicy", "WaitingQueue"]

SchedulingPolicy = Literal["fcfs", "priority"]
"""vLLM's ``--scheduling-policy`` values the simulator models (vLLM also has ``sjf``)."""


class Queued(Protocol):
    """What the queue reads of a request (``vllm_sim.engine.SeqHandle``)."""

    @property
    def priority(self) -> int:
        """The body's ``priority`` (lower first)."""
        ...

    @property
    def arrival(self) -> int:
        """Order of arrival at the engine."""
        ...


_Q = TypeVar("_Q", bound=Queued)


def _key(seq: Queued) -> tuple[int, int]:
    return (seq.priority, seq.arrival)


class WaitingQueue(Generic[_Q]):
    """Requests admitted to the engine but not yet running, in the policy's order.

    Args:
        policy: ``fcfs`` or ``priority`` (see the module docstring).
    """

    def __init__(self, policy: SchedulingPolicy = "fcfs") -> None:
        self.policy = policy
        self._fifo: deque[_Q] = deque()
        self._sorted: list[_Q] = []  # priority: ascending (priority, arrival)

    def add(self, seq: _Q) -> None:
        """Queue a new request (fcfs: at the back; priority: at its place)."""
        if self.policy == "fcfs":
            self._fifo.append(seq)
        else:
            bisect.insort(self._sorted, seq, key=_key)

    def prepend(self, seq: _Q) -> None:
        """Put a preempted request back (fcfs: at the front; priority: at its place)."""
        if self.policy == "fcfs":
            self._fifo.appendleft(seq)
        else:
            bisect.insort(self._sorted, seq, key=_key)

    def peek(self) -> _Q:
        """The request the scheduler considers next.

        Raises:
            IndexError: The queue is empty.
        """
        return self._fifo[0] if self.policy == "fcfs" else self._sorted[0]

    def pop(self) -> _Q:
        """Remove and return :meth:`peek`'s request.

        Raises:
            IndexError: The queue is empty.
        """
        return self._fifo.popleft() if self.policy == "fcfs" else self._sorted.pop(0)

    def remove(self, seq: _Q) -> None:
        """Remove ``seq`` (aborted while waiting).

        Raises:
            ValueError: ``seq`` is not waiting.
        """
        (self._fifo if self.policy == "fcfs" else self._sorted).remove(seq)

    def __contains__(self, seq: object) -> bool:
        return seq in (self._fifo if self.policy == "fcfs" else self._sorted)

    def __iter__(self) -> Iterator[_Q]:
        return iter(list(self._fifo) if self.policy == "fcfs" else list(self._sorted))

    def __len__(self) -> int:
        return len(self._fifo) + len(self._sorted)
