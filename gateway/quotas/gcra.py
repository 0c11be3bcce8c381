"""GCRA arithmetic shared by the in-memory limiter and mirrored by the Redis Lua scripts.

GCRA (generic cell rate algorithm, ITU-T I.371) keeps one number per bucket: the theoretical
arrival time ``tat``. With a limit of ``L`` units per ``W`` seconds each unit advances ``tat`` by
``T = W / L``; a request of cost ``c`` is admitted when ``max(tat, now) + c*T - W <= now``. The
bucket is full again at ``tat`` (the ``reset``); the burst is the whole limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_EPS = 1e-9


@dataclass(frozen=True)
class GcraResult:
    """Outcome of one GCRA check.

    Attributes:
        allowed: whether the cost fits now.
        new_tat: the tat to store when allowed (unchanged tat when refused).
        remaining: whole units left after the charge (or now, when refused).
        reset_s: seconds until the bucket is full again.
        retry_after_s: seconds until the cost would fit (0 when allowed, None if never).
    """

    allowed: bool
    new_tat: float
    remaining: int
    reset_s: float
    retry_after_s: float | None


def check(tat: float | None, now: float, limit: int, cost: int, window_s: float) -> GcraResult:
    """Check (without storing) whether ``cost`` units fit a GCRA bucket.

    Args:
        tat: stored theoretical arrival time in seconds, or None for an empty bucket.
        now: current time in seconds (same clock as ``tat``).
        limit: units per window (>= 1).
        cost: units this request needs (>= 0).
        window_s: window length in seconds.

    Returns:
        The result; ``retry_after_s`` is None when ``cost > limit`` (it can never fit).
    """
    interval = window_s / limit
    base = now if tat is None or tat < now else tat
    new_tat = base + cost * interval
    allow_at = new_tat - window_s
    if cost > limit:
        return GcraResult(False, base, _remaining(base, now, interval, window_s), base - now, None)
    if allow_at > now + _EPS:
        return GcraResult(
            False, base, _remaining(base, now, interval, window_s), base - now, allow_at - now
        )
    return GcraResult(
        True, new_tat, _remaining(new_tat, now, interval, window_s), new_tat - now, 0.0
    )


def adjust(tat: float | None, now: float, limit: int, delta: int, window_s: float) -> float | None:
    """Apply a correction of ``delta`` units (positive: more used than estimated).

    A positive delta may push ``tat`` past the burst (debt that later requests wait for); a
    negative one gives units back but never below an empty bucket.

    Returns:
        The new tat, or None when the bucket is empty (nothing to store).
    """
    interval = window_s / limit
    if delta >= 0:
        base = now if tat is None or tat < now else tat
        return base + delta * interval
    if tat is None:
        return None
    new_tat = tat + delta * interval
    return None if new_tat <= now else new_tat


def _remaining(tat: float, now: float, interval: float, window_s: float) -> int:
    return max(0, math.floor((window_s - (tat - now)) / interval + _EPS))
