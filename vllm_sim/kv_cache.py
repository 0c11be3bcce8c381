"""The simulator's paged KV cache: block hashes, prefix reuse, LRU eviction and KV events.

As vLLM V1's ``BlockPool`` (``vllm/v1/core/block_pool.py``) under its ``KVCacheManager``
(``vllm/v1/core/kv_cache_manager.py``), with blocks counted rather than stored:

* **Block hashes** (:func:`block_hashes`, vLLM's ``hash_block_tokens`` in
  ``vllm/v1/core/kv_cache_utils.py``): the hash of full block *i* is
  ``hash((hash of block i-1, tokens of block i))`` so a block's hash stands for its whole prefix.
* **Automatic prefix caching** (:class:`BlockCache`): a request references the cached blocks of
  its prefix; the rest are allocated from free blocks or by evicting the least recently used
  unreferenced cached block (vLLM's ``FreeKVCacheBlockQueue`` order). A block computed under a
  hash already cached references that block instead (vLLM deduplicates). When a request ends
  its full blocks stay cached, released tail first so that tail blocks are evicted first.
* **KV-cache events** (vLLM's ``--kv-events-config``, :mod:`vllm_sim.kv_events`): the cache
  records a ``Stored`` event when a block gets a hash no cached block has (with its parent's
  hash and its token ids), a ``Removed`` event when an eviction or a reset drops one, and
  ``Cleared`` when a reset finds nothing referenced, in :attr:`BlockCache.events` until the
  engine publishes them.

Which prefix a request may reuse, when its blocks are hashed and the metrics are the
scheduler's side, in :mod:`vllm_sim.engine`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from vllm_sim.kv_events import Cleared, Removed, SimEvent, Stored

__all__ = ["BlockCache", "block_hashes"]


def block_hashes(tokens: Sequence[object], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``tokens`` (a partial tail block has none).

    Returns:
        ``len(tokens) // block_size`` hashes; hash *i* depends on every token before the end
        of block *i* (vLLM's ``hash_block_tokens`` chaining, Python's ``hash`` instead of
        SHA-256: hashes are only compared inside one process).
    """
    out: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        out.append(parent)
    return out


class BlockCache:
    """A paged KV cache of ``num_blocks`` blocks with hash-addressed reuse and LRU eviction.

    Blocks are counted, not stored: a referenced block is either *hashed* (a full block whose
    hash is in ``_refs``) or *anonymous* (a partial or not yet computed block). Unreferenced
    hashed blocks stay cached in ``_lru`` until a new allocation evicts them.
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._refs: dict[int, int] = {}  # hash -> references (> 0)
        self._lru: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; LRU first
        self._anon = 0  # referenced blocks without a hash
        self.events: list[SimEvent] = []  # since the last publish

    @property
    def used(self) -> int:
        """Blocks referenced by running requests."""
        return len(self._refs) + self._anon

    @property
    def free(self) -> int:
        """Blocks an allocation may take: never used, or cached and unreferenced."""
        return self.num_blocks - self.used

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        """Number of leading ``hashes`` whose blocks are cached (referenced or not)."""
        n = 0
        for h in hashes:
            if h not in self._refs and h not in self._lru:
                break
            n += 1
        return n

    def acquire(self, hit: Sequence[int], new_blocks: int) -> bool:
        """Reference the cached blocks ``hit`` and allocate ``new_blocks`` anonymous blocks.

        Returns:
            False (and nothing changed) when the blocks do not fit.
        """
        revived = sum(1 for h in hit if h in self._lru)
        if new_blocks + revived > self.free:
            return False
        for h in hit:
            if h in self._lru:
                del self._lru[h]
                self._refs[h] = 1
            else:
                self._refs[h] += 1
        self._evict(max(0, self.used + new_blocks - (self.num_blocks - len(self._lru))))
        self._anon += new_blocks
        return True

    def promote(self, hashes: Sequence[int], parent: int | None = None,
                token_ids: Sequence[int] = (), block_size: int = 0) -> list[int]:
        """Give as many computed anonymous blocks the ``hashes`` (their content is now known).

        A hash already cached (another request computed the same block) is referenced instead
        and the anonymous block freed, as vLLM deduplicates. Returns the hashes now held.

        Args:
            hashes: Consecutive blocks' hashes.
            parent: Hash of the block before the first (None: they start the prompt).
            token_ids: Their tokens, ``block_size`` per block (for the ``Stored`` events).
            block_size: Tokens per block.
        """
        held: list[int] = []
        run: list[int] = []
        run_parent = parent
        run_start = 0
        prev = parent
        for i, h in enumerate(hashes):
            new = h not in self._refs and h not in self._lru
            if new and block_size:
                if not run:
                    run_parent, run_start = prev, i
                run.append(h)
            elif run:
                self._stored(run, run_parent, token_ids, run_start, block_size)
                run = []
            prev = h
            self._anon -= 1
            if h in self._refs:
                self._refs[h] += 1
            elif h in self._lru:
                del self._lru[h]
                self._refs[h] = 1
            else:
                self._refs[h] = 1
            held.append(h)
        if run:
            self._stored(run, run_parent, token_ids, run_start, block_size)
        return held

    def _stored(self, run: list[int], parent: int | None, token_ids: Sequence[int],
                start: int, size: int) -> None:
        tokens = tuple(token_ids[start * size : (start + len(run)) * size])
        if len(tokens) == len(run) * size:
            self.events.append(Stored(tuple(run), parent, tokens, size))

    def release(self, held: Sequence[int], anon: int) -> None:
        """Drop a finished request's references; unreferenced hashed blocks stay cached.

        ``held`` is in prompt order; it is released tail first so that eviction takes the
        tail blocks of a prefix before its head (vLLM frees blocks in reverse order).
        """
        self._anon -= anon
        for h in reversed(held):
            refs = self._refs[h] - 1
            if refs:
                self._refs[h] = refs
            else:
                del self._refs[h]
                self._lru[h] = None

    def reset(self) -> None:
        """Forget every unreferenced cached block (``POST /sim/reset``)."""
        if not self._refs:
            self.events.append(Cleared())
        elif self._lru:
            self.events.append(Removed(tuple(self._lru)))
        self._lru.clear()

    def _evict(self, n: int) -> None:
        gone = [self._lru.popitem(last=False)[0] for _ in range(n)]
        if gone:
            self.events.append(Removed(tuple(gone)))
