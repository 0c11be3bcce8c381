"""The ``prefix_affinity`` strategy: score allowed, healthy replicas by cached prefix against load.

For each candidate replica *r* (already filtered by the egress policy and health):

* ``match_r`` = leading prompt blocks indexed for *r* / prompt blocks (0 without blocks);
* ``load_r`` = ``waiting + running`` from *r*'s last scrape plus the gateway's requests sent to
  *r* since then (``outstanding - outstanding at scrape``, may be negative), or the gateway's own
  in-flight count when the scrape is missing or older than ``metrics_stale_s``;
* ``prefill_r`` = the gateway's estimate of the *uncached prompt tokens* it sent to *r* whose
  response has not started yet (each request adds its prompt tokens minus the tokens of its
  matched blocks at the decision and takes them off at its first response byte or its end),
  relative to this prompt's tokens: the prefill work queued ahead of this request, in units of
  this request's own prompt, so that it trades directly against ``match_r``;
* ``kv_r`` = scraped KV-cache usage (0 when unknown);

``score_r = w_prefix * match_r - w_load * load_r / (1 + mean load) - w_prefill * prefill_r
- w_kv * kv_r`` (the KV term only when some candidate holds part of the prompt: with nothing to
share the decision is by load alone); the highest score wins. **Ties**: the candidates whose
score without its load term is within ``tie_tolerance`` of the winner's and whose load is at
most ``ceil(session_load_factor x (total load + 1) / n)`` (or the winner's) are tied with it,
and the tie goes to the prompt's *rendezvous* winner (highest random weight, Thaler and
Ravishankar 1998; :mod:`gateway.fleet.placement`): the tied replica with the highest hash of
(the prompt's first block past the longest prefix any candidate holds, the replica's url). It
depends on the request alone, not on what this process has seen, so every gateway pod sends a
prefix none of them has yet seen cached to the same replica: without it each pod broke ties by
its own in-flight counts and turn, and the first requests of a prefix group landing on
different pods were spread over several replicas before any KV event (or, with the estimate,
ever) told the others. With ``w_prefix = w_prefill`` the two terms would compare the prefill
work this request waits for plus the part of its own prompt it prefills on each replica (the
greedy choice for its TTFT); the default ``w_prefill = w_prefix / 2`` also charges a move for
the copy of the prefix it puts into a second cache.
**Imbalance guard**: when the winner's load exceeds the least loaded candidate's by
``imbalance_abs`` and is more than ``imbalance_ratio x (least + 1)``, the least loaded candidate
is chosen instead.

**Session affinity** (option): a request with an ``x-session-id`` header or a body ``user`` goes
to its session's replica on a consistent-hash ring with bounded loads
(:class:`gateway.fleet.placement.SessionRing`).

After a decision the prompt's blocks are recorded for the chosen replica in the prefix index.

**Exact cache state**: for a replica whose KV-cache events are followed
(:mod:`gateway.fleet.kv_subscriber`) and in sync, and a request whose prompt token ids the
gateway knows (a completions ``prompt`` given as token ids, or a string ``prompt`` with
``tokenizer_file``), ``match_r`` is the fraction of the prompt's tokens in leading blocks the
replica *holds now* (:mod:`gateway.fleet.exact_index`) instead of the estimate; the uncached
prompt tokens charged to ``prefill_r`` follow from the same figure. ``explain["cache_state"]``
says which one decided (``exact`` when the chosen replica's exact state was used).

**Pending prefixes**: a request routed to an exact-state replica adds its prompt's blocks not
yet held there to the pending overlay (:mod:`gateway.fleet.pending`) until the replica's
``BlockStored`` for them arrives, its prefill is over (plus ``pending_settle_s``) or
``pending_max_age_s`` passes; the exact match counts a block as held when it is stored or
pending, so a second request of a new prefix group, routed before the first one's events,
follows it to its replica. ``explain["pending_tokens"]`` is the part of ``cached_tokens`` that
was only pending.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from gateway.fleet.exact_index import ExactIndex, content_keys
from gateway.fleet.hint import RouteHint, build_hint, load_tokenizer
from gateway.fleet.pending import PendingPrefixes
from gateway.fleet.placement import Rendezvous, SessionRing, prefix_anchor
from gateway.fleet.prefix_index import PrefixIndex
from gateway.fleet.settings import RoutingSettings
from gateway.fleet.tokenize import replica_token_ids

if TYPE_CHECKING:
    from ssl import SSLContext

    import aiohttp

    from gateway.fleet.replica import Replica

__all__ = ["EventFeed", "PrefixAffinity", "RouteHint"]


class EventFeed(Protocol):
    """What the scorer uses of a replica's KV-event subscriber
    (:class:`gateway.fleet.kv_subscriber.KVEventSubscriber` has it)."""

    @property
    def stats(self) -> Any:
        """The subscriber's counters (a dataclass, shown in the admin view)."""
        ...

    def exact(self) -> bool:
        """Whether the exact index of its replica is in sync (trusted for scoring)."""
        ...


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
        self.pending = PendingPrefixes(replicas, settings.pending_blocks,
                                       settings.pending_max_age_s, settings.pending_settle_s)
        self.exact = ExactIndex(replicas, self.pending)
        self._events: list[EventFeed | None] = [None] * replicas
        self._tokenizer: Any = None
        if settings.tokenizer_file is not None:
            self._tokenizer = load_tokenizer(str(settings.tokenizer_file))
        self._kv_tokens: list[int | None] = [None] * replicas
        # Tokens one index block stands for (to turn matched blocks into cached tokens).
        self._block_tokens = (float(settings.block_tokens) if self._tokenizer is not None
                              else settings.block_chars / settings.chars_per_token)
        self._seen: list[object] = [None] * replicas  # the signals last refreshed from
        self._queries: list[float] = [0.0] * replicas
        self._ring = SessionRing(settings.session_load_factor)
        self._rendezvous = Rendezvous()
        self._turn = 0
        self.decisions: dict[str, int] = {}

    def hint(self, body: Mapping[str, Any], session: str | None) -> RouteHint:
        """The routing hint of a request body (``session``: the ``x-session-id`` header);
        see :func:`gateway.fleet.hint.build_hint`."""
        return build_hint(body, session, self.settings, self._tokenizer)

    async def fill_token_ids(
        self, hint: RouteHint, body: Mapping[str, Any], candidates: Sequence[Replica],
        served_model: str, session: aiohttp.ClientSession, ssl: SSLContext | bool = True,
    ) -> None:
        """With ``tokenize: replica``, give a chat ``hint`` its prompt's token ids from a
        candidate's ``/tokenize`` (the first one whose events are followed); nothing on
        failure or when no candidate publishes events."""
        if (self.settings.tokenize != "replica" or hint.token_ids is not None
                or hint.session is not None or not isinstance(body.get("messages"), list)):
            return
        ask = next((r for r in candidates if self._events[r.index] is not None), None)
        if ask is None:
            return
        ids = await replica_token_ids(session, ask, served_model, body,
                                      self.settings.tokenize_timeout_s, ssl)
        if ids:
            hint.token_ids = ids
            hint.tokens = float(len(ids))

    def attach_events(self, replica: int, subscriber: EventFeed) -> None:
        """Follow ``replica``'s KV-cache events through ``subscriber`` (exact index)."""
        self._events[replica] = subscriber

    def cache_state(self, replica: int) -> str:
        """``exact`` when ``replica``'s events are followed and in sync, else ``estimate``."""
        sub = self._events[replica]
        return "exact" if sub is not None and sub.exact() else "estimate"

    def _exact_cached(
        self, candidates: Sequence[Replica], ids: list[int],
    ) -> tuple[dict[int, int], dict[int, int]]:
        """Cached prompt tokens of each exact-state candidate (replica index -> tokens), with
        pending blocks counted as cached and (the second map) without them."""
        by_size: dict[int, list[int]] = {}
        for r in candidates:
            sub = self._events[r.index]
            if sub is not None and sub.exact():
                size = self.exact.replicas[r.index].block_size or self.settings.block_tokens
                by_size.setdefault(size, []).append(r.index)
        out: dict[int, int] = {}
        stored: dict[int, int] = {}
        pending = bool(self.pending)
        for size, members in by_size.items():
            # vLLM reuses at most ``prompt - 1`` tokens (the last one is always computed).
            keys = content_keys(ids[: max(len(ids) - 1, 0)], size)
            for i, n in self.exact.match(keys, members).items():
                stored[i] = n * size
            if pending:
                for i, n in self.exact.match(keys, members, with_pending=True).items():
                    out[i] = n * size
        return (out if pending else stored), stored

    def load(self, r: Replica, now: float) -> float:
        """Estimated requests on ``r`` (see the module docstring)."""
        return self._loads((r,), now)[0]

    def _loads(self, candidates: Sequence[Replica], now: float) -> list[float]:
        """:meth:`load` of each candidate, in one loop (the decision's hot path)."""
        stale = self.settings.metrics_stale_s
        out: list[float] = []
        for r in candidates:
            sig = r.signals
            if sig is None or sig.running is None or now - sig.at > stale:
                out.append(float(r.outstanding))
            else:
                est = (sig.waiting or 0.0) + sig.running + r.outstanding - r.scrape_outstanding
                out.append(est if est > 0.0 else 0.0)
        return out

    def choose(self, candidates: Sequence[Replica], hint: RouteHint, now: float) -> Replica:
        """Pick one of ``candidates`` (non-empty, all available) and fill ``hint.explain``.

        The chosen replica's queued prefill estimate is charged with the request's uncached
        tokens; the caller calls :meth:`RouteHint.release` when the response starts or the
        attempt ends.

        Cost: one :meth:`PrefixIndex.match` for all replicas (one walk of the prompt's chain),
        one pass over the candidates for loads and one for scores, one
        :meth:`PrefixIndex.insert` for the winner with its known match (figures in
        docs/routing.md, from ``bench/routing_decision.py``).
        """
        self._refresh(candidates, now)
        if self.pending:
            self.pending.sweep(now)
        loads = self._loads(candidates, now)
        n = len(candidates)
        self._turn = turn = (self._turn + 1) % max(n, 1)
        if hint.session is not None and self.settings.session_affinity:
            i = self._ring.pick([r.url for r in candidates], loads, hint.session)
            return self._chosen(candidates[i], hint, "session", loads[i], min(loads), 0, now)
        total = len(hint.hashes)
        matched = self.index.match(hint.hashes, self.replicas) if total else [0] * self.replicas
        exact, stored = (self._exact_cached(candidates, hint.token_ids)
                         if hint.token_ids and any(self._events) else ({}, {}))
        # Per candidate: the fraction of the prompt cached there (exact, or the estimate).
        frac_scale = 1.0 / total if total else 0.0
        ntok = float(len(hint.token_ids)) if hint.token_ids else 1.0
        fracs = [exact[r.index] / ntok if r.index in exact else frac_scale * matched[r.index]
                 for r in candidates]
        w = self.settings.weights
        w_prefix, w_load = w.prefix, w.load
        w_prefill = w.prefill / max(hint.tokens, 1.0)
        mean = sum(loads) / n
        load_scale = w_load / (1.0 + mean)
        # Nothing of the prompt is indexed anywhere: decide on load alone (no KV term), so that
        # affinity costs nothing when there is nothing to share.
        w_kv = w.kv if any(fracs) else 0.0
        best = least = 0
        best_score = -math.inf
        least_key: tuple[float, int] | None = None
        base: list[float] = []  # each score without its load term
        for i, r in enumerate(candidates):
            b = w_prefix * fracs[i] - w_prefill * r.prefill_tokens
            if w_kv:
                sig = r.signals
                if sig is not None and sig.kv_usage is not None:
                    b -= w_kv * sig.kv_usage
            base.append(b)
            score = b - load_scale * loads[i]
            if score > best_score:
                best, best_score = i, score
            lkey = (loads[i], r.outstanding)
            if least_key is None or lkey < least_key:
                least, least_key = i, lkey
        # Tied with the winner: as good on cache and queued prefill (within the tolerance) and
        # not overloaded (the bound of consistent hashing with bounded loads, or no busier
        # than the winner). The rendezvous hash picks among them, the same on every pod.
        s = self.settings
        floor = base[best] - s.tie_tolerance
        bound = max(math.ceil(s.session_load_factor * (mean * n + 1) / n), loads[best])
        tied = [i for i in range(n) if base[i] >= floor and loads[i] <= bound]
        if len(tied) > 1:
            if hint.units:
                # Anchored on the stored state (what every pod learns from the events), not on
                # this pod's pending overlay, so that pods still agree.
                best = self._rendezvous.pick([r.url for r in candidates], tied, self._anchor(
                    hint, max(matched[r.index] for r in candidates), stored))
            else:  # nothing to hash (an empty prompt): the fewest outstanding, then in turn
                best = min(tied, key=lambda i: (candidates[i].outstanding, (i - turn) % n))
        reason = "prefix" if fracs[best] else "load"
        gap = loads[best] - loads[least]
        if gap >= s.imbalance_abs and loads[best] > s.imbalance_ratio * (loads[least] + 1):
            best, reason = least, "imbalance"
        chosen = candidates[best]
        return self._chosen(
            chosen, hint, reason, loads[best], loads[least], matched[chosen.index], now,
            exact.get(chosen.index), len(tied), stored.get(chosen.index),
        )

    def _anchor(self, hint: RouteHint, blocks: int, exact: Mapping[int, int]) -> int:
        """Stable 64-bit hash of the prompt's first block past the longest cached prefix.

        The depth is the most any candidate holds (exact tokens when some candidate's events
        are in sync, else ``blocks``, the most indexed blocks); the block is the next
        ``block_tokens`` token ids or ``block`` units of the hint (the last block when the
        whole prompt is held). BLAKE2b, not Python's per-process ``hash``, so that every
        gateway process gets the same value.
        """
        if exact and hint.token_ids:
            return prefix_anchor(hint.token_ids, max(exact.values()), self.settings.block_tokens)
        return prefix_anchor(hint.units, blocks * hint.block, hint.block)

    def _chosen(
        self, r: Replica, hint: RouteHint, reason: str, load: float, least: float,
        matched: int, now: float, exact_tokens: int | None = None, tied: int = 1,
        stored_tokens: int | None = None,
    ) -> Replica:
        if hint.hashes:
            # ``matched`` is the match just taken (0 for a session pick: probe every block).
            self.index.insert(r.index, hint.hashes, matched if reason != "session" else None)
        queued = r.prefill_tokens
        cached = matched * self._block_tokens if exact_tokens is None else exact_tokens
        hint.charged = cost = max(0.0, hint.tokens - cached)
        hint._replica = r
        pending_tokens = 0
        if exact_tokens is not None and stored_tokens is not None:
            pending_tokens = exact_tokens - stored_tokens
            self._add_pending(r, hint, stored_tokens, now)
        r.prefill_tokens = queued + cost
        sig = r.signals
        fresh = sig is not None and now - sig.at <= self.settings.metrics_stale_s
        hint.explain = {
            "strategy": "prefix_affinity",
            "reason": reason,
            "replica": r.index,
            "matched_blocks": matched,
            "prompt_blocks": len(hint.hashes),
            "cache_state": "estimate" if exact_tokens is None else "exact",
            "cached_tokens": round(cached),
            "load": round(load, 2),
            "least_load": round(least, 2),
            "prefill_tokens": round(queued),
            "outstanding": r.outstanding,
            "waiting": sig.waiting if fresh and sig is not None else None,
            "running": sig.running if fresh and sig is not None else None,
            "kv_usage": sig.kv_usage if fresh and sig is not None else None,
            "signals_age_s": round(now - sig.at, 3) if sig is not None else None,
            "tied": tied,
            "pending_tokens": pending_tokens,
        }
        self.decisions[reason] = self.decisions.get(reason, 0) + 1
        return r

    def _add_pending(self, r: Replica, hint: RouteHint, stored_tokens: int, now: float) -> None:
        """Put the prompt's blocks past the ``stored_tokens`` ``r`` holds in the pending overlay
        (all its full blocks: the ones vLLM will store), replacing an earlier attempt's entry."""
        if hint.pending and hint._overlay is not None:
            hint._overlay.settle(hint.pending)
            hint.pending = 0
        ids = hint.token_ids
        if not ids or not self.settings.pending_blocks:
            return
        size = self.exact.replicas[r.index].block_size or self.settings.block_tokens
        keys = content_keys(ids, size)[stored_tokens // size:]
        hint.pending = self.pending.add(r.index, keys, now)
        hint._overlay = self.pending

    def _refresh(self, candidates: Sequence[Replica], now: float) -> None:
        """Size each replica's index from its KV capacity; forget it when its counters reset."""
        s = self.settings
        seen = self._seen
        for r in candidates:
            sig = r.signals
            if sig is None or sig is seen[r.index]:
                continue  # nothing new since the last refresh (the common case)
            seen[r.index] = sig
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

    def describe(self, r: Replica) -> dict[str, Any]:
        """Index figures of ``r`` for the admin view."""
        sub = self._events[r.index]
        return {"prefill_tokens": r.prefill_tokens,
                "index_blocks": self.index.size(r.index),
                "index_capacity": self.index.capacity(r.index),
                "cache_state": self.cache_state(r.index),
                "exact_blocks": self.exact.size(r.index),
                "pending_blocks": self.pending.size(r.index),
                "kv_events": None if sub is None else dataclasses.asdict(sub.stats)}

