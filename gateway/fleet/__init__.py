"""Fleet-aware routing: backend load signals, a prefix index and the ``prefix_affinity`` strategy.

* :mod:`gateway.fleet.settings`: the ``routing:`` config section.
* :mod:`gateway.fleet.replica_metrics`: scrape and parse each replica's vLLM ``/metrics``.
* :mod:`gateway.fleet.prefix_index`: canonical prompt rendering, chained block hashes, per-replica
  LRU index.
* :mod:`gateway.fleet.hint`: a request's routing hint (prompt blocks, session, token count).
* :mod:`gateway.fleet.placement`: stable-hash placement (session ring, rendezvous tie-break).
* :mod:`gateway.fleet.scoring`: the decision (prefix match against load, imbalance guard,
  session affinity).
"""

from gateway.fleet.hint import RouteHint
from gateway.fleet.prefix_index import PrefixIndex, block_hashes, canonical_prompt
from gateway.fleet.replica import ReplicaSignals
from gateway.fleet.replica_metrics import MetricsScraper, parse_metrics
from gateway.fleet.scoring import PrefixAffinity
from gateway.fleet.settings import RoutingSettings, RoutingWeights

__all__ = [
    "MetricsScraper",
    "PrefixAffinity",
    "PrefixIndex",
    "ReplicaSignals",
    "RouteHint",
    "RoutingSettings",
    "RoutingWeights",
    "block_hashes",
    "canonical_prompt",
    "parse_metrics",
]
