"""An approximate index of which replica recently served which prompt prefix.

The prompt is rendered to one canonical string (:func:`canonical_prompt`), cut into blocks of
``block_chars`` characters (or ``block_tokens`` tokens with a tokenizer), and each block gets a
*chained* hash, ``hash((hash of the previous block, block))``, so one hash stands for the whole
prefix up to the end of its block, as in vLLM's automatic prefix caching. A partial tail block
is not indexed (vLLM caches full blocks only).

:class:`PrefixIndex` keeps, per replica, an LRU of block hashes sized from that replica's KV
capacity, and one map ``hash -> bitmask of replicas`` so that matching a prompt against every
replica is a binary search over its blocks per replica holding its first block.
"""

from __future__ import annotations

import json
from collections import OrderedDict
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

    def size(self, replica: int) -> int:
        """Blocks indexed for ``replica``."""
        return len(self._lru[replica])

    def capacity(self, replica: int) -> int:
        """Entries ``replica`` may hold."""
        return self._cap[replica]

    def set_capacity(self, replica: int, capacity: int) -> None:
        """Resize ``replica``'s LRU (from its KV capacity); evicts at once when it shrinks."""
        self._cap[replica] = max(1, capacity)
        self._trim(replica)

    def match(self, hashes: Sequence[int], replicas: int) -> list[int]:
        """Leading blocks of ``hashes`` indexed for each replica ``0 .. replicas - 1``.

        Only replicas holding the first block can match. For each of them a binary search finds
        the deepest block it holds: a chained hash stands for its whole prefix, and the index
        evicts a prefix tail first, so holding block *i* means holding blocks ``0 .. i``. That
        is about ``log2(len(hashes))`` dictionary lookups per holding replica.
        """
        counts = [0] * replicas
        n = len(hashes)
        if not n:
            return counts
        owners = self._owners
        holders = owners.get(hashes[0], 0) & ((1 << replicas) - 1)
        while holders:
            bit = holders & -holders
            holders ^= bit
            lo, hi = 1, n  # block lo - 1 is held; find the largest such lo
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if owners.get(hashes[mid - 1], 0) & bit:
                    lo = mid
                else:
                    hi = mid - 1
            counts[bit.bit_length() - 1] = lo
        return counts

    def insert(self, replica: int, hashes: Sequence[int]) -> None:
        """Record that ``replica`` now holds the prefix ``hashes`` (most recently used).

        The tail is touched first so that the head of a prefix is evicted last, as vLLM frees
        a request's blocks in reverse order.
        """
        lru = self._lru[replica]
        touch = lru.move_to_end
        bit = 1 << replica
        owners = self._owners
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
