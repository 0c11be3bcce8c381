"""One request being relayed (:class:`Exchange`): shared by the forwarder and the backends.

Its own module so that backends (:mod:`gateway.relay.litellm_backend`) and the forwarder
(:mod:`gateway.relay.forward`) both use it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.fleet import RouteHint
    from gateway.h1.asgi_io import DisconnectWatch, Responder
    from gateway.pii.response import ResponseMasker
    from gateway.relay.records import RequestRecord
    from gateway.relay.rewrite import ParsedBody
    from gateway.routing import Pool, Replica
    from gateway.state import GatewayState

__all__ = ["Exchange"]


@dataclass(slots=True)
class Exchange:
    """One request being relayed: what to send, and where to write the answer."""

    state: GatewayState
    pool: Pool
    candidates: tuple[Replica, ...]
    parsed: ParsedBody
    accept: str
    forwarded: list[tuple[str, str]]
    out: Responder
    record: RequestRecord
    watch: DisconnectWatch
    t0: float
    hint: RouteHint | None = None  # prefix_affinity: released when the prefill is over
    masker: ResponseMasker | None = None  # pii.responses: mask (gateway.pii.request)
