"""The ``routing:`` section of the gateway config (fleet-aware routing, ``prefix_affinity``).

Example::

    routing:
      metrics_interval_s: 0.5      # scrape every replica's vLLM /metrics this often
      block_chars: 128             # prefix index: characters per block (no tokenizer)
      session_affinity: true       # keep x-session-id / body "user" on one replica
      weights: {prefix: 1.0, load: 0.25, prefill: 0.5, kv: 0.25}

Every field has a default that works; the section may be left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field

from gateway.config.base import FrozenSection

__all__ = ["KVEventsSource", "RoutingSettings", "RoutingWeights", "check_endpoint"]


def check_endpoint(endpoint: str, replica_url: str) -> None:
    """Refuse a KV-event endpoint that is not ``tcp://<the replica's host>:<port>``.

    Raises:
        ValueError: Another scheme or host, or no port; the message names the endpoint.
    """
    parts = urlsplit(endpoint)
    host = urlsplit(replica_url).hostname
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or port is None:
        raise ValueError(f"{endpoint!r}: expected tcp://host:port")
    if parts.hostname != host:
        raise ValueError(
            f"{endpoint!r}: host {parts.hostname!r} is not the replica's host {host!r} (the "
            "egress policy allows only the replica itself)")


class RoutingWeights(FrozenSection):
    """Weights of the ``prefix_affinity`` score (see :mod:`gateway.fleet.scoring`).

    Attributes:
        prefix: Weight of the matched prefix fraction (0..1).
        load: Weight of the replica's load (requests) relative to the fleet mean,
            ``load / (1 + mean)``. Low by default: requests that are decoding barely delay a
            new request's prefill (queued prefill counts in ``prefill``), and a holder left
            for load copies its prefix into a second cache (see docs/routing.md).
        prefill: Weight of the uncached prompt tokens the gateway sent to the replica whose
            response has not started, relative to this request's prompt tokens (the prefix
            term counts in the same unit; half its weight: a warm request leaves its prefix's
            holder only when about two more prompts of prefill are queued there than elsewhere,
            since each move copies the prefix into a second cache; see docs/routing.md).
        kv: Weight of the replica's KV-cache usage (0..1).
    """

    prefix: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    load: float = Field(default=0.25, ge=0, allow_inf_nan=False)
    prefill: float = Field(default=0.5, ge=0, allow_inf_nan=False)
    kv: float = Field(default=0.25, ge=0, allow_inf_nan=False)


class KVEventsSource(FrozenSection):
    """Where one replica publishes its KV-cache events (vLLM ``--kv-events-config``).

    vLLM's side: ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
    "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv"}'``.
    vLLM binds its PUB socket only when the endpoint has ``*`` (else it connects out); the
    gateway connects to it, so give vLLM a ``*`` endpoint. The replay socket always binds.

    Attributes:
        replica: The replica's ``url`` exactly as in its model's ``replicas``.
        endpoint: The publisher, ``tcp://<the replica's host>:<port>``.
        replay_endpoint: The publisher's replay (ROUTER) socket on the same host, for gaps.
        topic: The topic the publisher sends on (vLLM's default: empty).
        replay_timeout_s: Seconds to wait for each replay answer before giving a gap up.
    """

    replica: str
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""
    replay_timeout_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)


class RoutingSettings(FrozenSection):
    """Signals and weights of fleet-aware routing.

    Attributes:
        metrics: Scrape the replicas' ``/metrics`` (only when a model uses ``prefix_affinity``).
        metrics_interval_s: Seconds between two scrapes of a replica.
        metrics_timeout_s: Timeout of one scrape, seconds.
        metrics_stale_s: Scraped figures older than this (seconds) are ignored; the gateway's
            own in-flight count is used instead.
        metrics_path: Path of the metrics endpoint.
        block_chars: Characters per prefix-index block (when no tokenizer is configured).
        tokenizer_file: A Hugging Face ``tokenizer.json``: index blocks of ``block_tokens``
            tokens instead of characters (needs the ``tokenizers`` package).
        block_tokens: Tokens per block with a tokenizer (vLLM's block size: 16).
        chars_per_token: Characters per token assumed to size the index from a replica's KV
            capacity (``vllm:cache_config_info``) when blocks are characters.
        index_blocks: Index entries per replica when the replica's KV capacity is unknown.
        max_prompt_chars: Only the first this many characters of a prompt are indexed.
        session_affinity: Route requests with an ``x-session-id`` header or a body ``user``
            by consistent hashing (under ``session_load_factor``) instead of by prefix.
        session_load_factor: A replica takes a session only while its load is at most this
            factor times the mean load plus one (consistent hashing with bounded loads).
        imbalance_abs: Imbalance guard: when the best-scored replica carries this many more
            requests than the least loaded one ...
        imbalance_ratio: ... and more than this factor times (its load + 1), the least loaded
            replica is chosen.
        tie_tolerance: Candidates whose score without its load term is within this of the
            winner's (score units: a fraction of the prompt) and whose load is within the
            ``session_load_factor`` bound are tied with it, and a tie goes to the prompt's
            rendezvous winner:
            the tied replica with the highest hash of (the prompt's first block past the
            longest cached prefix, replica url). Every gateway process computes the same
            winner from the request alone, so pods that have not yet seen a prefix (no KV event
            yet, or each pod's own estimate) still send it to the same replica. 0: exact ties
            only.
        weights: Score weights.
        kv_events: Replicas whose KV-cache events give the exact cache state; the others are
            scored from the estimate (see :mod:`gateway.fleet.exact_index`).
        tokenize: ``replica``: a chat request's token ids come from a replica's ``/tokenize``
            (one round trip; :mod:`gateway.fleet.tokenize`), so that chat prompts are matched
            against the exact index too; ``none`` (default): chat prompts use the estimate.
            Only asked when some replica of the pool publishes KV events.
        tokenize_timeout_s: Longest wait for that answer, seconds (then the estimate decides).
        pending_blocks: With KV events: most blocks of routed, not yet stored prompts kept in
            the pending overlay (:mod:`gateway.fleet.pending`; the oldest go first). 0: off.
        pending_max_age_s: A pending entry is dropped this many seconds after its decision,
            whatever happened (a lost event cannot pin a replica).
        pending_settle_s: ... and this many seconds after its request's prefill is over (first
            response byte, or the attempt ended), the grace for its events still in flight.
    """

    metrics: bool = True
    metrics_interval_s: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    metrics_timeout_s: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    metrics_stale_s: float = Field(default=2.0, gt=0, allow_inf_nan=False)
    metrics_path: str = "/metrics"
    block_chars: int = Field(default=128, ge=8, le=65536)
    tokenizer_file: Path | None = None
    block_tokens: int = Field(default=16, ge=1, le=4096)
    chars_per_token: float = Field(default=4.0, gt=0, allow_inf_nan=False)
    index_blocks: int = Field(default=20_000, ge=1)
    max_prompt_chars: int = Field(default=1_000_000, ge=1)
    session_affinity: bool = False
    session_load_factor: float = Field(default=1.25, ge=1.0, allow_inf_nan=False)
    imbalance_abs: int = Field(default=8, ge=1)
    imbalance_ratio: float = Field(default=2.0, ge=1.0, allow_inf_nan=False)
    tie_tolerance: float = Field(default=0.1, ge=0, allow_inf_nan=False)
    weights: RoutingWeights = Field(default_factory=RoutingWeights)
    kv_events: list[KVEventsSource] = Field(default_factory=list)
    tokenize: Literal["none", "replica"] = "none"
    tokenize_timeout_s: float = Field(default=0.5, gt=0, allow_inf_nan=False)
    pending_blocks: int = Field(default=100_000, ge=0)
    pending_max_age_s: float = Field(default=30.0, gt=0, allow_inf_nan=False)
    pending_settle_s: float = Field(default=0.5, ge=0, allow_inf_nan=False)
