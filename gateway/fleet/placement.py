"""Placement by stable hashing: the session ring and the rendezvous tie-break.

Both choose a replica from the request alone (a session key, a prompt block) and the replicas'
urls, never from what this process has seen, so every gateway pod makes the same choice.

**Session affinity**: a session key goes to the first replica clockwise from the key's point on
a consistent-hash ring (64 virtual nodes per replica) whose load is below
``ceil(load_factor x (total load + 1) / n)``: consistent hashing with bounded loads (Mirrokni,
Thorup, Zadimoghaddam, SODA 2018).

**Rendezvous** (highest random weight, Thaler and Ravishankar 1998): among tied replicas, the
one with the highest ``mix(anchor XOR point(url))``, where the anchor is a hash of the prompt's
first block past the longest prefix any candidate holds (:func:`prefix_anchor`).

Hashes are BLAKE2b (64-bit) and SplitMix64's finaliser, not Python's per-process ``hash``:
the same values in every process and across restarts.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence

__all__ = ["Rendezvous", "SessionRing", "prefix_anchor", "stable_point"]

_VNODES = 64
_M64 = (1 << 64) - 1


def stable_point(key: str) -> int:
    """A 64-bit point of ``key`` (BLAKE2b), the same in every process."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def _mix(x: int) -> int:
    """SplitMix64's finaliser: a 64-bit integer to a well-spread 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def prefix_anchor(units: str | Sequence[int], depth: int, size: int) -> int:
    """Stable 64-bit hash of the block ``units[depth : depth + size]``.

    Args:
        units: The prompt as canonical text (characters) or token ids.
        depth: Units already held somewhere (the longest cached prefix), >= 0.
        size: Units per block, >= 1.

    Returns:
        BLAKE2b-64 of the block after ``depth`` (of the last ``size`` units when the whole
        prompt is held); token ids are hashed as their comma-joined decimal text.
    """
    span = units[depth: depth + size] or units[-size:]
    raw = span.encode() if isinstance(span, str) else ",".join(map(str, span)).encode()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big")


class Rendezvous:
    """Highest-random-weight choice among tied replicas, with a bounded cache of url points."""

    def __init__(self) -> None:
        self._seeds: dict[str, int] = {}  # replica url -> its rendezvous point

    def pick(self, urls: Sequence[str], tied: Sequence[int], anchor: int) -> int:
        """The position in ``tied`` (non-empty indexes into ``urls``) of highest weight.

        Returns:
            The index (into ``urls``) with the highest ``mix(anchor XOR point(url))``; the
            first of ``tied`` on equal weights.
        """
        seeds = self._seeds
        best, top = tied[0], -1
        for i in tied:
            url = urls[i]
            seed = seeds.get(url)
            if seed is None:
                if len(seeds) > 4096:
                    seeds.clear()
                seeds[url] = seed = stable_point(url)
            weight = _mix(anchor ^ seed)
            if weight > top:
                best, top = i, weight
        return best


class SessionRing:
    """Consistent hashing with bounded loads over a pool's replicas (rings cached per url set).

    Args:
        load_factor: ``session_load_factor``: a replica takes a session while its load is below
            ``ceil(load_factor x (total load + 1) / n)``.
    """

    def __init__(self, load_factor: float) -> None:
        self.load_factor = load_factor
        self._rings: dict[tuple[str, ...], tuple[list[int], list[int]]] = {}

    def pick(self, urls: Sequence[str], loads: Sequence[float], key: str) -> int:
        """The index (into ``urls``, same length as ``loads``, non-empty) for session ``key``.

        The first replica clockwise from ``key``'s point under the load bound; the least loaded
        one when every replica is at it.
        """
        names = tuple(urls)
        ring = self._rings.get(names)
        if ring is None:
            points = sorted(
                (stable_point(f"{url}#{v}"), i) for i, url in enumerate(names)
                for v in range(_VNODES)
            )
            ring = ([p for p, _ in points], [i for _, i in points])
            if len(self._rings) > 64:
                self._rings.clear()
            self._rings[names] = ring
        bound = math.ceil(self.load_factor * (sum(loads) + 1) / len(loads))
        start = bisect.bisect(ring[0], stable_point(key))
        owners = ring[1]
        for step in range(len(owners)):
            i = owners[(start + step) % len(owners)]
            if loads[i] < bound:
                return i
        return min(range(len(loads)), key=loads.__getitem__)
