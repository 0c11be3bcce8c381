"""The ``prefix_affinity`` strategy: score allowed, healthy replicas by cached prefix against load.

For each candidate replica *r* (already filtered by the egress policy and health):

* ``match_r`` = leading prompt blocks indexed for *r* / prompt blocks (0 without blocks);
* ``load_r`` = ``waiting + running`` from *r*'s last scrape plus the gateway's requests sent to
  *r* since then (``outstanding - outstanding at scrape``, may be negative), or the gateway's own
  in-flight count when the scrape is missing or older than ``metrics_stale_s``;
* ``kv_r`` = scraped KV-cache usage (0 when unknown);

``score_r = w_prefix * match_r - w_load * load_r / (1 + mean load) - w_kv * kv_r`` (the KV term
only when some candidate holds part of the prompt: with nothing to share the decision is by load
alone); the highest score wins, ties go to the fewest outstanding requests, then in turn.
**Imbalance guard**: when the winner's load exceeds the least loaded candidate's by
``imbalance_abs`` and is more than ``imbalance_ratio x (least + 1)``, the least loaded candidate
is chosen instead.

**Session affinity** (option): a request with an ``x-session-id`` header or a body ``user`` goes
to the first replica clockwise from the session's point on a consistent-hash ring (64 virtual
nodes per replica) whose load is within ``ceil(session_load_factor x (total load + 1) / n)``:
consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA 2018).

After a decision the prompt's blocks are recorded for the chosen replica in the prefix index.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.fleet.prefix_index import (
    PrefixIndex,
    block_hashes,
    canonical_prompt,
    token_block_hashes,
)
from gateway.fleet.settings import RoutingSettings

if TYPE_CHECKING:
    from gateway.routing import Replica

__all__ = ["PrefixAffinity", "RouteHint"]

_VNODES = 64


@dataclass(slots=True)
class RouteHint:
    """What the strategy needs from one request, and what it decided.

    Attributes:
        hashes: Chained block hashes of the canonical prompt.
        session: Session key (``x-session-id`` header or body ``user``), if any.
        explain: Filled by the decision: strategy, reason, matched and prompt blocks, and the
            load figures used (copied to the access line and the audit record).
    """

    hashes: list[int]
    session: str | None = None
    explain: dict[str, Any] | None = None


class PrefixAffinity:
    """Prefix index, load estimate and the decision of one pool.

    Args:
        replicas: Replicas in the pool (index positions).
        settings: The ``routing`` section.

    Raises:
        ValueError: ``tokenizer_file`` is set but cannot be loaded (message names the file).
    """

    def __init__(self, replicas: int, settings: RoutingSettings) -> None:
        self.settings = settings
        self.replicas = replicas
        self.index = PrefixIndex(replicas, settings.index_blocks)
        self._tokenizer: Any = None
        if settings.tokenizer_file is not None:
            self._tokenizer = _load_tokenizer(str(settings.tokenizer_file))
        self._kv_tokens: list[int | None] = [None] * replicas
        self._queries: list[float] = [0.0] * replicas
        self._rings: dict[tuple[str, ...], tuple[list[int], list[int]]] = {}
        self._turn = 0
        self.decisions: dict[str, int] = {}

    def hint(self, body: Mapping[str, Any], session: str | None) -> RouteHint:
        """The routing hint of a request body (``session``: the ``x-session-id`` header)."""
        s = self.settings
        text = canonical_prompt(body)
        hashes: list[int] = []
        if text:
            if self._tokenizer is not None:
                ids = self._tokenizer.encode(text[: s.max_prompt_chars]).ids
                hashes = token_block_hashes(ids, s.block_tokens)
            else:
                hashes = block_hashes(text, s.block_chars, s.max_prompt_chars)
        if session is None and s.session_affinity:
            user = body.get("user")
            session = user if isinstance(user, str) and user else None
        return RouteHint(hashes, session if s.session_affinity else None)

    def load(self, r: Replica, now: float) -> float:
        """Estimated requests on ``r`` (see the module docstring)."""
        sig = r.signals
        if (
            sig is None
            or sig.running is None
            or now - sig.at > self.settings.metrics_stale_s
        ):
            return float(r.outstanding)
        return max(0.0, (sig.waiting or 0.0) + sig.running + r.outstanding - r.scrape_outstanding)

    def choose(self, candidates: Sequence[Replica], hint: RouteHint, now: float) -> Replica:
        """Pick one of ``candidates`` (non-empty, all available) and fill ``hint.explain``."""
        self._refresh(candidates, now)
        loads = [self.load(r, now) for r in candidates]
        n = len(candidates)
        self._turn = (self._turn + 1) % max(n, 1)
        if hint.session is not None and self.settings.session_affinity:
            i = self._session_pick(candidates, loads, hint.session)
            return self._chosen(candidates[i], hint, "session", loads[i], min(loads), 0, now)
        total = len(hint.hashes)
        matched = self.index.match(hint.hashes, self.replicas) if total else [0] * self.replicas
        w = self.settings.weights
        mean = sum(loads) / n
        # Nothing of the prompt is indexed anywhere: decide on load alone (no KV term), so that
        # affinity costs nothing when there is nothing to share.
        w_kv = w.kv if any(matched[r.index] for r in candidates) else 0.0
        best = 0
        best_key: tuple[float, int, int] | None = None
        for i, r in enumerate(candidates):
            frac = matched[r.index] / total if total else 0.0
            sig = r.signals
            kv = sig.kv_usage if w_kv and sig is not None and sig.kv_usage is not None else 0.0
            score = w.prefix * frac - w.load * loads[i] / (1.0 + mean) - w_kv * kv
            key = (score, -r.outstanding, -((i - self._turn) % n))
            if best_key is None or key > best_key:
                best, best_key = i, key
        least = min(range(n), key=lambda i: (loads[i], candidates[i].outstanding))
        reason = "prefix" if matched[candidates[best].index] else "load"
        gap = loads[best] - loads[least]
        s = self.settings
        if gap >= s.imbalance_abs and loads[best] > s.imbalance_ratio * (loads[least] + 1):
            best, reason = least, "imbalance"
        chosen = candidates[best]
        return self._chosen(
            chosen, hint, reason, loads[best], loads[least], matched[chosen.index], now
        )

    def _chosen(
        self, r: Replica, hint: RouteHint, reason: str, load: float, least: float,
        matched: int, now: float,
    ) -> Replica:
        if hint.hashes:
            self.index.insert(r.index, hint.hashes)
        sig = r.signals
        fresh = sig is not None and now - sig.at <= self.settings.metrics_stale_s
        hint.explain = {
            "strategy": "prefix_affinity",
            "reason": reason,
            "replica": r.index,
            "matched_blocks": matched,
            "prompt_blocks": len(hint.hashes),
            "load": round(load, 2),
            "least_load": round(least, 2),
            "outstanding": r.outstanding,
            "waiting": sig.waiting if fresh and sig is not None else None,
            "running": sig.running if fresh and sig is not None else None,
            "kv_usage": sig.kv_usage if fresh and sig is not None else None,
            "signals_age_s": round(now - sig.at, 3) if sig is not None else None,
        }
        self.decisions[reason] = self.decisions.get(reason, 0) + 1
        return r

    def _refresh(self, candidates: Sequence[Replica], now: float) -> None:
        """Size each replica's index from its KV capacity; forget it when its counters reset."""
        s = self.settings
        for r in candidates:
            sig = r.signals
            if sig is None:
                continue
            if sig.prefix_queries is not None:
                if sig.prefix_queries < self._queries[r.index]:
                    self.index.clear(r.index)  # restarted or cache reset: nothing is cached
                self._queries[r.index] = sig.prefix_queries
            kv = sig.kv_tokens
            if kv is not None and kv != self._kv_tokens[r.index]:
                self._kv_tokens[r.index] = kv
                if self._tokenizer is not None:
                    blocks = kv // s.block_tokens
                else:
                    blocks = int(kv * s.chars_per_token / s.block_chars)
                self.index.set_capacity(r.index, blocks)

    def _session_pick(self, candidates: Sequence[Replica], loads: list[float], key: str) -> int:
        urls = tuple(r.url for r in candidates)
        ring = self._rings.get(urls)
        if ring is None:
            points = sorted(
                (_point(f"{url}#{v}"), i) for i, url in enumerate(urls) for v in range(_VNODES)
            )
            ring = ([p for p, _ in points], [i for _, i in points])
            if len(self._rings) > 64:
                self._rings.clear()
            self._rings[urls] = ring
        bound = math.ceil(self.settings.session_load_factor * (sum(loads) + 1) / len(loads))
        start = bisect.bisect(ring[0], _point(key))
        owners = ring[1]
        for step in range(len(owners)):
            i = owners[(start + step) % len(owners)]
            if loads[i] < bound:
                return i
        return min(range(len(loads)), key=loads.__getitem__)

    def describe(self, r: Replica) -> dict[str, Any]:
        """Index figures of ``r`` for the admin view."""
        return {"index_blocks": self.index.size(r.index),
                "index_capacity": self.index.capacity(r.index)}


def _point(key: str) -> int:
    # A stable hash (not Python's randomised one): sessions keep their replica across restarts.
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def _load_tokenizer(path: str) -> Any:
    try:
        from tokenizers import Tokenizer  # optional dependency, only with tokenizer_file
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ValueError(f"routing.tokenizer_file {path}: the 'tokenizers' package is missing") \
            from exc
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:
        raise ValueError(f"routing.tokenizer_file {path}: cannot load: {exc}") from exc
