"""The gateway's own HTTP/1.1: the client-facing server and the relay's upstream client.

:mod:`gateway.h1.framing` is the strict framing core without I/O, both ways (request heads and
bodies for the server, response heads and bodies for the client); :mod:`gateway.h1.server` the
server's connection protocol, :mod:`gateway.h1.asgi_io` the app side of its ASGI messages and
:mod:`gateway.h1.conntable` which idle connection makes room at the connection cap;
:mod:`gateway.h1.transport` the plain-TCP sockets' transport and listener both sides run on;
:mod:`gateway.h1.client` the asyncio protocol of one upstream connection and the bounded
keep-alive pool that hands responses to :mod:`gateway.relay.forward`, dialing through
:mod:`gateway.h1.dial` (the egress policy's resolver and checks). This package exports the
client's API.
"""

from gateway.h1.client import (
    AttemptObserver,
    ConnectFailed,
    ConnectionClosed,
    ConnectTimedOut,
    H1Connection,
    IncompleteBody,
    RelayClient,
    Response,
)
from gateway.h1.dial import Dialer, resolver_dialer
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
