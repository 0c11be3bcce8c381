"""What the fleet's background parts read of the router (:class:`gateway.routing.Router`
has it): its pools, each with replicas and, for ``prefix_affinity``, the scorer.

Protocols, so that :mod:`gateway.fleet.replica_metrics` and :mod:`gateway.fleet.kv_subscriber`
depend on the shape of the router, not on :mod:`gateway.routing` (which builds the scorer of
:mod:`gateway.fleet.scoring` and would close an import circle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.fleet.replica import Replica
    from gateway.fleet.scoring import PrefixAffinity

__all__ = ["Fleet", "FleetPool"]


class FleetPool(Protocol):
    """One model's pool (:class:`gateway.routing.Pool`)."""

    @property
    def replicas(self) -> Sequence[Replica]:
        """The pool's replicas, in index order."""
        ...

    @property
    def affinity(self) -> PrefixAffinity | None:
        """The ``prefix_affinity`` scorer, ``None`` for other strategies."""
        ...

    @property
    def wants_signals(self) -> bool:
        """Whether the pool's strategy or flow control reads scraped metrics."""
        ...


class Fleet(Protocol):
    """The router: pools by model name."""

    @property
    def pools(self) -> Mapping[str, FleetPool]:
        """Model name -> pool."""
        ...
