"""One backend replica's run-time state (:class:`Replica`) and its last metrics scrape
(:class:`ReplicaSignals`): the data the router, the scorer and the scrapers share.

A leaf of the routing layers: :mod:`gateway.routing` builds pools of replicas and picks one;
:mod:`gateway.fleet.scoring`, :mod:`gateway.fleet.replica_metrics` and
:mod:`gateway.fleet.kv_subscriber` read and update them; none of those import each other
through this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Replica", "ReplicaSignals"]


@dataclass(frozen=True, slots=True)
class ReplicaSignals:
    """One scrape of one replica.

    Attributes:
        at: Monotonic time of the scrape, seconds.
        waiting: Requests in the replica's waiting queue (``None`` if not reported).
        running: Requests in its running batch.
        kv_usage: KV-cache usage, 0..1.
        prefix_hits: Prefix-cache hits counter, tokens.
        prefix_queries: Prefix-cache queries counter, tokens.
        num_gpu_blocks: KV-cache blocks (``vllm:cache_config_info``).
        block_size: Tokens per block.
    """

    at: float
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    prefix_hits: float | None = None
    prefix_queries: float | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None

    @property
    def kv_tokens(self) -> int | None:
        """KV capacity in tokens, when ``vllm:cache_config_info`` gave it."""
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size


@dataclass(eq=False, slots=True)
class Replica:
    """Run-time state of one backend replica.

    Attributes:
        model: Canonical model name of the pool.
        index: Position in the pool (stable).
        url: Server root URL (no trailing slash).
        api_key: Credential sent to the backend as ``Authorization: Bearer``.
        destination: Egress policy destination id, if configured.
        region: Region of that destination (filled from the egress policy at start-up).
        kind: ``vllm`` (byte relay) or ``litellm`` (called through litellm).
        litellm_model: litellm model string for ``litellm`` replicas.
        client: Per-replica client object for ``litellm`` replicas (set at start-up).
        outstanding: Requests currently in flight to this replica.
        ejected_until: Monotonic time (s) until which passive health keeps it out.
        probe_ok: Result of the last active health probe (``True`` before the first probe).
        failures: Failures counted against the replica since start (for metrics).
        signals: The last scrape of the replica's ``/metrics`` (``prefix_affinity`` pools).
        scrape_outstanding: ``outstanding`` at the time of that scrape.
        prefill_tokens: Estimated uncached prompt tokens of the requests ``prefix_affinity``
            sent here whose response has not started (see :class:`gateway.fleet.RouteHint`).
        flow_in_flight: Flow-controlled requests in flight to this replica per priority class
            (index: class, 0 the highest; empty until flow control hands it a request), from
            the hand-over to the request's end (see :mod:`gateway.flow.saturation`).
        peer_in_flight: The same counts of the other gateway processes, summed (kept by
            :mod:`gateway.flow.peers` with ``flow_control.shared``; empty otherwise).
    """

    model: str
    index: int
    url: str
    api_key: str | None = field(default=None, repr=False)
    destination: str | None = None
    region: str | None = None
    kind: str = "vllm"
    litellm_model: str | None = None
    client: Any = field(default=None, repr=False)
    outstanding: int = 0
    ejected_until: float = 0.0
    probe_ok: bool = True
    failures: int = 0
    signals: ReplicaSignals | None = None
    scrape_outstanding: int = 0
    prefill_tokens: float = 0.0
    flow_in_flight: list[int] = field(default_factory=list)
    peer_in_flight: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        """Name of the replica for client-facing messages: model, position and destination id.

        Never the URL: backend addresses are internal network layout, which error bodies sent
        to API clients must not reveal (the access log and audit record carry the URL).
        """
        where = f" ({self.destination})" if self.destination else ""
        return f"{self.model} replica {self.index}{where}"

    def available(self, now: float) -> bool:
        """True when the replica is neither ejected nor failing its active probe."""
        return self.probe_ok and now >= self.ejected_until

    def observe(self, signals: ReplicaSignals) -> None:
        """Store a scrape of the replica's metrics (and the in-flight count it reflects)."""
        self.signals = signals
        self.scrape_outstanding = self.outstanding

    def mark_probe(self, ok: bool) -> None:
        """Record an active health probe result; a passing probe also ends an ejection."""
        self.probe_ok = ok
        if ok:
            self.ejected_until = 0.0
