"""An approximate index of which replica recently served which prompt prefix.

The prompt is rendered to one canonical string (:func:`canonical_prompt`), cut into blocks of
``block_chars`` characters (or ``block_tokens`` tokens with a tokenizer), and each block gets a
*chained* hash, ``hash((hash of the previous block, block))``, so one hash stands for the whole
prefix up to the end of its block, as in vLLM's automatic prefix caching. A partial tail block
is not indexed (vLLM caches full blocks only).

:class:`PrefixIndex` keeps, per replica, an LRU of block hashes sized from that replica's KV
capacity, and one map ``hash -> bitmask of replicas`` (kept consistent with the LRUs on every
insert and eviction) so that matching a prompt against every replica is one binary search over
its blocks shared by all replicas holding its first block.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["PrefixIndex", "block_hashes", "canonical_prompt", "token_block_hashes"]

_SEP_FIELD = "\x1f"
_SEP_MSG = "\x1e"


def _content(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # Multi-part content and anything else: its compact JSON, stable across requests.
    return json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_prompt(body: Mapping[str, Any]) -> str | None:
    """The prompt of a chat or completions body as one prefix-stable string.

    Chat: the ``tools`` (compact JSON, sorted keys) first, then each message in order as
    ``role<US>content<RS>`` (US/RS: ASCII unit/record separators; tool calls and names are part of
    the message). Completions: the ``prompt`` string, or a list of prompts joined by RS. A later
    turn of a conversation renders to a string that starts with the earlier turn's.

    Returns:
        The rendering, or ``None`` when the body has neither ``messages`` nor ``prompt``.
    """
    messages = body.get("messages")
    if isinstance(messages, list):
        parts: list[str] = []
        tools = body.get("tools")
        if tools:
            parts.append("tools" + _SEP_FIELD + _content(tools) + _SEP_MSG)
        for msg in messages:
            if not isinstance(msg, Mapping):
                continue
            text = _content(msg.get("content"))
            extra = {k: msg[k] for k in ("name", "tool_calls", "tool_call_id") if k in msg}
            if extra:
                text += _SEP_FIELD + _content(extra)
            parts.append(str(msg.get("role", "")) + _SEP_FIELD + text + _SEP_MSG)
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return _SEP_MSG.join(p if isinstance(p, str) else _content(p) for p in prompt)
    return None


def block_hashes(text: str, block_chars: int, max_chars: int) -> list[int]:
    """Chained hashes of the full ``block_chars`` blocks of ``text[:max_chars]``.

    Python's ``hash`` (randomised per process; the index lives in one process) keeps the cost at
    about 0.1 us per block.
    """
    end = min(len(text), max_chars)
    out: list[int] = []
    h = 0
    for start in range(0, end - block_chars + 1, block_chars):
        h = hash((h, text[start : start + block_chars]))
        out.append(h)
    return out


def token_block_hashes(ids: Sequence[int], block_tokens: int) -> list[int]:
    """Chained hashes of the full blocks of token ids (with a configured tokenizer)."""
    out: list[int] = []
    h = 0
    for start in range(0, len(ids) - block_tokens + 1, block_tokens):
        h = hash((h, tuple(ids[start : start + block_tokens])))
        out.append(h)
    return out


class PrefixIndex:
    """Per-replica LRUs of chained block hashes with a shared ownership map.

    Args:
        replicas: Number of replicas (positions ``0 .. replicas - 1``).
        capacity: Entries per replica (each replica's LRU is cut to its capacity).

    Memory: about 200 bytes per (replica, block) entry on CPython 3.11 (measured by
    ``bench/routing_decision.py``).
    """

    def __init__(self, replicas: int, capacity: int) -> None:
        self._lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(replicas)]
        self._cap = [capacity] * replicas
        self._owners: dict[int, int] = {}
        # Per replica, the prompt of its last insert while nothing else changed its LRU since.
        self._last: list[list[int] | None] = [None] * replicas

    def size(self, replica: int) -> int:
        """Blocks indexed for ``replica``."""
        return len(self._lru[replica])

    def capacity(self, replica: int) -> int:
        """Entries ``replica`` may hold."""
        return self._cap[replica]

    def set_capacity(self, replica: int, capacity: int) -> None:
        """Resize ``replica``'s LRU (from its KV capacity); evicts at once when it shrinks."""
        self._cap[replica] = max(1, capacity)
        self._last[replica] = None
        self._trim(replica)

    def match(self, hashes: Sequence[int], replicas: int) -> list[int]:
        """Leading blocks of ``hashes`` indexed for each replica ``0 .. replicas - 1``.

        Only replicas holding the first block can match. A chained hash stands for its whole
        prefix, and the index evicts a prefix tail first, so holding block *i* means holding
        blocks ``0 .. i``: the deepest block held is found by binary search. The search runs
        once for all replicas: each probe ``owners[hash] & mask`` splits the replicas still in an
        interval into those holding the probed block (deeper half) and the others (shallower
        half), so replicas that hold the same prefix share every probe. That is about
        ``log2(len(hashes))`` dictionary lookups per distinct matched depth, not per replica;
        each replica's probes are the ones of its own binary search, so the result is the same.

        A linear walk of the chain (one lookup per matched block, even in C) is slower here: with
        100,000 blocks per replica the map outgrows the CPU caches and each lookup is a cache
        miss, so ~6 probes beat ~60 (62 matched blocks, 8 x 100,000 indexed: 6.1 us for this
        search against 10.6 us for the C-level walk alone, interleaved in one process).
        """
        counts = [0] * replicas
        n = len(hashes)
        if not n:
            return counts
        owners = self._owners
        holders = owners.get(hashes[0], 0) & ((1 << replicas) - 1)
        if not holders:
            return counts
        # (lo, hi, mask): each replica in mask holds block lo - 1 and no block past hi - 1.
        todo = [(1, n, holders)]
        while todo:
            lo, hi, mask = todo.pop()
            if lo == hi:
                while mask:
                    bit = mask & -mask
                    mask ^= bit
                    counts[bit.bit_length() - 1] = lo
                continue
            mid = (lo + hi + 1) // 2
            deeper = owners.get(hashes[mid - 1], 0) & mask
            if deeper:
                todo.append((mid, hi, deeper))
            if deeper != mask:
                todo.append((lo, mid - 1, mask & ~deeper))
        return counts

    def insert(self, replica: int, hashes: Sequence[int], held: int | None = None) -> None:
        """Record that ``replica`` now holds the prefix ``hashes`` (most recently used).

        The tail is touched first so that the head of a prefix is evicted last, as vLLM frees
        a request's blocks in reverse order.

        When the previous change to ``replica``'s LRU was inserting ``hashes`` or a longer prefix
        of which ``hashes`` is the head (its block ``len(hashes) - 1`` has the same chained hash,
        so the whole head is equal), those blocks are already the most recent in this order and
        nothing is touched: an O(1) check instead of one LRU move per block for a hot prompt.

        Args:
            replica: Position of the replica.
            hashes: The prompt's chained block hashes.
            held: Leading blocks of ``hashes`` already indexed for ``replica`` (its
                :meth:`match` count, taken since the last change of the index), when known:
                the new tail is then added without probing, and the held head is moved to the
                recent end in one C-level pass.
        """
        n = len(hashes)
        last = self._last[replica]
        if n and last is not None and n <= len(last) and last[n - 1] == hashes[n - 1]:
            return
        self._last[replica] = list(hashes)
        lru = self._lru[replica]
        bit = 1 << replica
        owners = self._owners
        if held is not None:
            # Blocks ``held ..`` are absent (holding one would mean holding block ``held``).
            for h in reversed(hashes[held:]):
                lru[h] = None
                owners[h] = owners.get(h, 0) | bit
            deque(map(lru.move_to_end, reversed(hashes[:held])), maxlen=0)
            if held < n:
                self._trim(replica)
            return
        touch = lru.move_to_end
        added = False
        for h in reversed(hashes):
            try:
                touch(h)  # the common case: the block is indexed already (one lookup)
            except KeyError:
                lru[h] = None
                owners[h] = owners.get(h, 0) | bit
                added = True
        if added:
            self._trim(replica)

    def clear(self, replica: int) -> None:
        """Forget everything indexed for ``replica`` (it restarted or its cache was reset)."""
        self._last[replica] = None
        lru = self._lru[replica]
        while lru:
            self._drop(replica, lru.popitem(last=False)[0])

    def _trim(self, replica: int) -> None:
        lru = self._lru[replica]
        while len(lru) > self._cap[replica]:
            self._drop(replica, lru.popitem(last=False)[0])

    def _drop(self, replica: int, h: int) -> None:
        mask = self._owners.get(h, 0) & ~(1 << replica)
        if mask:
            self._owners[h] = mask
        else:
            self._owners.pop(h, None)
