"""The exact per-replica block index, kept from vLLM's KV-cache events.

Each replica's ``BlockStored`` events say which full blocks it cached, with their tokens; its
``BlockRemoved`` events which it evicted (by vLLM's hash); ``AllBlocksCleared`` that it dropped
everything (:mod:`gateway.fleet.kv_events`). The index keys a block by its *content*:
``key = hash((parent key, block tokens, lora name, extra keys))`` chained from the prompt's first
block, and remembers, per replica, vLLM's hash of each block to find it again on removal. The
gateway computes the same keys from a request's prompt token ids (:func:`content_keys`), so it
never has to reproduce vLLM's hash function or its seed (``PYTHONHASHSEED``).

A stored block whose parent the index does not know (stored before the gateway subscribed and
no longer in the replay buffer) cannot be keyed: it is counted in ``orphans`` and skipped; it
would only ever match after its parent, which the index lacks, so nothing is lost for matching.
Events of KV-cache groups other than the first (hybrid models: sliding-window groups) are
ignored: the full-attention group decides what a prompt reuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.fleet.kv_events import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored, Event
from gateway.fleet.pending import PendingPrefixes

__all__ = ["ExactIndex", "ReplicaBlocks", "content_keys"]


def content_keys(token_ids: Sequence[int], block_size: int, lora: str | None = None) -> list[int]:
    """Chained content keys of the full ``block_size`` blocks of ``token_ids``.

    Args:
        token_ids: The prompt as the replica tokenizes it.
        block_size: The replica's block size in tokens (learnt from its events).
        lora: LoRA adapter name of the request (part of vLLM's block identity).
    """
    out: list[int] = []
    key = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        key = hash((key, tuple(token_ids[start : start + block_size]), lora, None))
        out.append(key)
    return out


@dataclass(slots=True)
class ReplicaBlocks:
    """One replica's blocks and event bookkeeping.

    Attributes:
        by_hash: vLLM hash -> content key, for every block held.
        block_size: Tokens per block from its last ``BlockStored`` (None before one).
        orphans: Stored blocks skipped because their parent was unknown.
        events: Events applied.
    """

    by_hash: dict[BlockHash, int] = field(default_factory=dict)
    block_size: int | None = None
    orphans: int = 0
    events: int = 0


class ExactIndex:
    """The exact block sets of ``replicas`` replicas, with a shared ``key -> bitmask`` map.

    Args:
        replicas: Number of replicas (positions ``0 .. replicas - 1``).
        pending: The overlay of blocks routed and not yet stored (:mod:`gateway.fleet.pending`):
            a ``BlockStored`` confirms its block there, and :meth:`match` may count it as held.
    """

    def __init__(self, replicas: int, pending: PendingPrefixes | None = None) -> None:
        self.replicas = [ReplicaBlocks() for _ in range(replicas)]
        self._owners: dict[int, int] = {}
        self.pending = pending

    def size(self, replica: int) -> int:
        """Blocks ``replica`` holds."""
        return len(self.replicas[replica].by_hash)

    def apply(self, replica: int, events: Sequence[Event]) -> None:
        """Apply one batch's events to ``replica``'s set, in order."""
        rb = self.replicas[replica]
        bit = 1 << replica
        owners = self._owners
        pending = self.pending if self.pending else None
        for ev in events:
            rb.events += 1
            if isinstance(ev, BlockStored):
                if ev.group_idx not in (None, 0):
                    continue
                rb.block_size = size = ev.block_size
                if ev.parent_block_hash is None:
                    key = 0
                else:
                    parent = rb.by_hash.get(ev.parent_block_hash)
                    if parent is None:
                        rb.orphans += len(ev.block_hashes)
                        continue
                    key = parent
                extras = ev.extra_keys
                for i, h in enumerate(ev.block_hashes):
                    extra: Any = extras[i] if extras is not None and i < len(extras) else None
                    key = hash((key, ev.token_ids[i * size : (i + 1) * size], ev.lora_name,
                                extra))
                    if h not in rb.by_hash:
                        owners[key] = owners.get(key, 0) | bit
                    rb.by_hash[h] = key
                    if pending is not None:
                        pending.confirm(replica, key)
            elif isinstance(ev, BlockRemoved):
                if ev.group_idx not in (None, 0):
                    continue
                for h in ev.block_hashes:
                    k = rb.by_hash.pop(h, None)
                    if k is not None:
                        self._drop(k, bit)
            elif isinstance(ev, AllBlocksCleared):
                self.clear(replica)

    def clear(self, replica: int) -> None:
        """Forget ``replica``'s blocks (cache reset, restart, unrecoverable gap)."""
        rb = self.replicas[replica]
        bit = 1 << replica
        for k in rb.by_hash.values():
            self._drop(k, bit)
        rb.by_hash.clear()

    def match(self, keys: Sequence[int], replicas: Sequence[int],
              with_pending: bool = False) -> dict[int, int]:
        """Leading blocks of ``keys`` each of ``replicas`` holds (a walk of the chain).

        A replica may hold block *i* without block *i - 1* (vLLM evicts blocks one by one, in
        any order); reuse stops at the first missing block, so the walk drops a replica at its
        first miss. With ``with_pending``, a block pending on a replica (routed there, not yet
        stored) counts as held.
        """
        mask = 0
        for r in replicas:
            mask |= 1 << r
        counts = dict.fromkeys(replicas, 0)
        owners = self._owners
        extra = self.pending.owners if with_pending and self.pending is not None else None
        for depth, k in enumerate(keys):
            held = owners.get(k, 0)
            if extra is not None:
                held |= extra.get(k, 0)
            held &= mask
            gone = mask & ~held
            while gone:
                bit = gone & -gone
                gone ^= bit
                counts[bit.bit_length() - 1] = depth
            mask = held
            if not mask:
                return counts
        while mask:
            bit = mask & -mask
            mask ^= bit
            counts[bit.bit_length() - 1] = len(keys)
        return counts

    def _drop(self, key: int, bit: int) -> None:
        mask = self._owners.get(key, 0) & ~bit
        if mask:
            self._owners[key] = mask
        else:
            self._owners.pop(key, None)
