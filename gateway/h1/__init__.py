"""The relay's own HTTP/1.1 client for the upstream exchange (framing, connection, pool).

:mod:`gateway.h1.framing` parses response heads and decodes bodies (no I/O),
:mod:`gateway.h1.connection` is the asyncio protocol of one connection, and
:mod:`gateway.h1.client` the bounded keep-alive pool that dials through the upstream
connector (the egress policy's checks) and hands responses to :mod:`gateway.relay.forward`.
"""

from gateway.h1.client import (
    AttemptObserver,
    ConnectFailed,
    ConnectTimedOut,
    Dialer,
    RelayClient,
    Response,
    resolver_dialer,
)
from gateway.h1.connection import ConnectionClosed, H1Connection, IncompleteBody
from gateway.h1.framing import ProtocolError

__all__ = [
    "AttemptObserver",
    "ConnectFailed",
    "ConnectTimedOut",
    "ConnectionClosed",
    "Dialer",
    "H1Connection",
    "IncompleteBody",
    "ProtocolError",
    "RelayClient",
    "Response",
    "resolver_dialer",
]
