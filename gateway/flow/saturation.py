"""Whether a replica has room for one more request of a class (pure logic over the load signals).

A replica is **full** for a class when any threshold of the class
(:class:`~gateway.flow.settings.SaturationSettings`) is reached:

* ``in_flight``: the requests of **this class and the classes below it** that the gateway has
  (with ``flow_control.shared``: that every gateway process has) in flight to the replica
  (``flow_in_flight[cls:]``, plus ``peer_in_flight[cls:]``, summed) reach it. A higher class's
  requests never count against a lower class's allowance, and a lower class can never take the
  slots its threshold leaves to the classes above: with ``interactive`` at 8 and ``batch`` at 4,
  batch holds at most 4 of a replica's 8 and interactive may fill the rest, whatever batch holds;
* ``queue_depth``: its estimated waiting queue reaches it. The estimate is the scraped
  ``vllm:num_requests_waiting`` plus the change of the gateway's in-flight count since that
  scrape (``outstanding - scrape_outstanding``): requests sent since are assumed to wait, and
  each request that ended since let a waiting one run. With ``workers`` gateway processes each
  sees only its own change and assumes the others' is the same (the change counts ``workers``
  times), so that together they send the room left, not ``workers`` times it;
* ``kv_usage``: the scraped ``vllm:kv_cache_usage_perc`` reaches it;
* ``prefill_tokens``: the uncached prompt tokens the gateway sent the replica whose response
  has not started (``Replica.prefill_tokens``, kept by ``prefix_affinity``), times
  ``workers``, reach it: saturation in tokens, not requests, known without a scrape.

Scraped figures older than ``stale_s`` (or missing) are not used: the replica is then judged by
``in_flight`` alone, and has room without that threshold (flow control does not hold requests
back on figures it does not have). The fleet is **saturated** for a request when every
candidate replica allowed for it is full.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from gateway.flow.settings import SaturationSettings

__all__ = ["LoadSignals", "ReplicaLoad", "has_room", "with_room"]


class LoadSignals(Protocol):
    """The scraped figures used (``gateway.fleet.ReplicaSignals``)."""

    @property
    def at(self) -> float:
        """Monotonic time of the scrape, seconds."""
        ...

    @property
    def waiting(self) -> float | None:
        """``vllm:num_requests_waiting``."""
        ...

    @property
    def kv_usage(self) -> float | None:
        """``vllm:kv_cache_usage_perc`` (0..1)."""
        ...


class ReplicaLoad(Protocol):
    """What a replica tells about its load (``gateway.routing.Replica``)."""

    @property
    def outstanding(self) -> int:
        """Requests the gateway has in flight to it."""
        ...

    @property
    def scrape_outstanding(self) -> int:
        """``outstanding`` when the last scrape was stored."""
        ...

    @property
    def flow_in_flight(self) -> Sequence[int]:
        """Flow-controlled requests in flight to it, per class (index 0: the highest); empty
        before the first one."""
        ...

    @property
    def peer_in_flight(self) -> Sequence[int]:
        """Flow-controlled requests other gateway processes have in flight to it, per class
        (``flow_control.shared``; empty otherwise)."""
        ...

    @property
    def prefill_tokens(self) -> float:
        """Uncached prompt tokens sent to it whose response has not started."""
        ...

    @property
    def signals(self) -> LoadSignals | None:
        """The last scrape, if any."""
        ...


_R = TypeVar("_R", bound=ReplicaLoad)


def has_room(replica: ReplicaLoad, cls: int, limits: SaturationSettings, now: float,
             stale_s: float, workers: int = 1) -> bool:
    """True when ``replica`` is below every threshold of ``limits`` for class ``cls`` (rules:
    module docstring).

    Args:
        replica: The replica.
        cls: The request's class index (0 is the highest).
        limits: The thresholds of that class (for this worker: see
            :meth:`~gateway.flow.settings.FlowControlSettings.limits`).
        now: Monotonic time, seconds.
        stale_s: Scrapes older than this many seconds are ignored.
        workers: Gateway worker processes sharing the replica (``gateway serve --workers``).
    """
    if limits.in_flight is not None and (sum(replica.flow_in_flight[cls:])
                                         + sum(replica.peer_in_flight[cls:])
                                         >= limits.in_flight):
        return False
    if (limits.prefill_tokens is not None
            and workers * replica.prefill_tokens >= limits.prefill_tokens):
        return False
    sig = replica.signals
    if sig is None or now - sig.at > stale_s:
        return True
    kv = sig.kv_usage
    if kv is not None and kv >= limits.kv_usage:
        return False
    waiting = sig.waiting
    if waiting is not None:
        estimate = waiting + workers * (replica.outstanding - replica.scrape_outstanding)
        if estimate >= limits.queue_depth:
            return False
    return True


def with_room(
    replicas: Sequence[_R], cls: int, limits: SaturationSettings, now: float, stale_s: float,
    workers: int = 1,
) -> Sequence[_R]:
    """The replicas of ``replicas`` with room for class ``cls`` (``replicas`` itself when all
    have room); arguments as :func:`has_room`."""
    room = [r for r in replicas if has_room(r, cls, limits, now, stale_s, workers)]
    return replicas if len(room) == len(replicas) else room
