"""Pending prefixes: blocks of prompts routed to a replica whose ``BlockStored`` has not arrived.

The exact index (:mod:`gateway.fleet.exact_index`) learns a replica's blocks from its KV events,
which come when the replica has scheduled the prompt's prefill. A request routed there and still
waiting or prefilling is invisible to it: a second request of the same prefix, routed before
those events, found nothing cached anywhere and went by load, often to another replica (the gap
docs/routing.md measured). This overlay remembers, per replica, the content keys
(:func:`gateway.fleet.exact_index.content_keys`) of the blocks this process routed there and has
not seen stored, and the exact match counts a block as held when it is stored **or** pending.

An entry (one routed request) leaves:

* block by block, when the replica's ``BlockStored`` for that block arrives (:meth:`confirm`:
  the exact index holds it from then on, and follows its eviction);
* ``settle_s`` seconds after the request's prefill is over (its first response byte, or the
  attempt ended or failed: :meth:`settle`), the grace for events still in flight;
* ``max_age_s`` seconds after it was added, whatever happened (a lost event or a hung request
  cannot pin a replica);
* oldest first when the overlay holds more than ``max_blocks`` blocks (bounded memory: about
  210 bytes per pending block on CPython 3.11, tracemalloc, 100,000 blocks in entries of 32).

A block pending on a replica through two requests is counted twice; a ``BlockStored`` drops it
at once for both (from then on the exact index has it).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PendingPrefixes"]


@dataclass(slots=True)
class _Entry:
    replica: int
    keys: tuple[int, ...]
    added: float


class PendingPrefixes:
    """Per-replica pending block keys with a shared ``key -> bitmask`` map.

    Args:
        replicas: Number of replicas (positions ``0 .. replicas - 1``).
        max_blocks: Most pending blocks held (the oldest entries go first past it).
        max_age_s: Seconds after which an entry is dropped in any case.
        settle_s: Seconds an entry stays after :meth:`settle` (events still in flight).

    Times are the caller's clock (seconds, the ``now`` passed to :meth:`add` and :meth:`sweep`).
    """

    def __init__(self, replicas: int, max_blocks: int, max_age_s: float, settle_s: float) -> None:
        self.owners: dict[int, int] = {}  # key -> bitmask of replicas it is pending on
        self._counts: dict[tuple[int, int], int] = {}  # (key, replica) -> entries holding it
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # oldest first
        self._now = 0.0  # the latest time seen (add, sweep)
        self._deadlines: deque[tuple[float, int]] = deque()  # (drop at, entry), in time order
        self._per_replica = [0] * replicas
        self._blocks = 0
        self._next = 0
        self.max_blocks = max_blocks
        self.max_age_s = max_age_s
        self.settle_s = settle_s

    def __bool__(self) -> bool:
        return bool(self._entries)

    def size(self, replica: int) -> int:
        """Blocks pending on ``replica`` (each block once)."""
        return self._per_replica[replica]

    def add(self, replica: int, keys: Sequence[int], now: float) -> int:
        """Record ``keys`` as pending on ``replica``; returns the entry id (0: nothing added)."""
        if not keys:
            return 0
        self._next += 1
        entry = self._next
        self._now = max(self._now, now)
        self._entries[entry] = _Entry(replica, tuple(keys), now)
        bit = 1 << replica
        counts, owners = self._counts, self.owners
        for k in keys:
            n = counts.get((k, replica), 0)
            if not n:
                owners[k] = owners.get(k, 0) | bit
                self._per_replica[replica] += 1
            counts[(k, replica)] = n + 1
        self._blocks += len(keys)
        while self._blocks > self.max_blocks and self._entries:
            self._drop(next(iter(self._entries)))
        return entry

    def confirm(self, replica: int, key: int) -> None:
        """``replica`` stored the block ``key``: it is no longer pending there."""
        if self._counts.pop((key, replica), None) is not None:
            self._unset(replica, key)

    def settle(self, entry: int) -> None:
        """The request of ``entry`` finished its prefill (or ended): drop it after the grace.

        The grace runs from the latest time the overlay saw (the last decision: no clock is
        read here), so it is shorter, never longer, when no decision came for a while.
        """
        if entry in self._entries:
            self._deadlines.append((self._now + self.settle_s, entry))

    def sweep(self, now: float) -> None:
        """Drop the entries past their grace or their age (called before each decision)."""
        self._now = max(self._now, now)
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            self._drop(deadlines.popleft()[1])
        entries = self._entries
        oldest = now - self.max_age_s
        while entries:
            entry, e = next(iter(entries.items()))
            if e.added > oldest:
                break
            self._drop(entry)

    def _drop(self, entry: int) -> None:
        e = self._entries.pop(entry, None)
        if e is None:
            return  # already dropped (by age or the cap) before its deadline came
        self._blocks -= len(e.keys)
        r = e.replica
        counts = self._counts
        for k in e.keys:
            n = counts.get((k, r))
            if n is None:
                continue  # confirmed stored since
            if n > 1:
                counts[(k, r)] = n - 1
            else:
                del counts[(k, r)]
                self._unset(r, k)

    def _unset(self, replica: int, key: int) -> None:
        self._per_replica[replica] -= 1
        mask = self.owners.get(key, 0) & ~(1 << replica)
        if mask:
            self.owners[key] = mask
        else:
            self.owners.pop(key, None)
