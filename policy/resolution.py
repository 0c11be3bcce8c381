"""Name checks for the socket methods that resolve a host name before their audit event.

CPython's ``connect``, ``connect_ex``, ``sendto``, ``sendmsg`` and ``bind`` accept
``(hostname, port)`` and resolve the name (C ``getaddrinfo``, so a DNS query) while parsing the
address, *before* they raise their ``socket.connect``/``socket.sendto``/``socket.sendmsg``/
``socket.bind`` audit event (``getsockaddrarg`` runs first in ``Modules/socketmodule.c``). An
audit hook alone therefore sees those names only after they have left the process.

:func:`install` replaces these five methods on :class:`socket.socket` (the Python class every
standard-library and third-party client instantiates, ``ssl.SSLSocket`` included) with wrappers
that raise the audit event :data:`RESOLVE_EVENT` ``(method, socket, host, port)`` when the
address holds a name that C would resolve; an egress guard's hook refuses it before anything is
sent. The wrappers are installed once per process, stay installed (like audit hooks) and cost an
``isinstance`` and an address parse per call when no guard is active.

Not covered from here, and how the guard closes it (see ``docs/policy.md``):

* instances of the C type ``_socket.socket`` itself (or a Python subclass of it that is not a
  :class:`socket.socket`) bypass the wrappers: the guard refuses to create such inet sockets
  (``socket.__new__`` event) in ``enforce`` mode;
* calling the C method unbound, ``_socket.socket.connect(sock, (name, port))``, resolves
  before any Python code runs: the guard can only refuse the connection and record the event
  afterwards (the query has left). The network layer (Cilium ``rules.dns``) is the control there.
"""

from __future__ import annotations

import _socket
import socket
import sys
from collections.abc import Callable
from typing import Any

from .addresses import parse_ip

#: The audit event the wrappers raise: ``(method, socket, host, port)``.
RESOLVE_EVENT = "policy.socket.resolve"

_INET_FAMILIES = frozenset({socket.AF_INET, socket.AF_INET6})
_MARK = "__policy_resolve_check__"


def resolved_name(address: object) -> str | None:
    """Return the host name C would resolve for a socket address, or ``None``.

    ``None`` for address literals (no query: ``inet_pton``/``inet_aton`` forms, which
    :func:`~policy.addresses.parse_ip` accepts), the wildcard ``""``, ``"<broadcast>"`` and
    anything that is not an ``(host, port, ...)`` tuple (``AF_UNIX`` paths and friends).

    Args:
        address: the address argument as passed to ``connect``/``sendto``/``bind``.
    """
    if not isinstance(address, tuple) or not address:
        return None
    host = address[0]
    if isinstance(host, bytes | bytearray):
        host = bytes(host).decode("ascii", "replace")
    if not isinstance(host, str) or host in ("", "<broadcast>"):
        return None
    try:  # the common cases in C, as setipaddr tries them first
        _socket.inet_pton(_socket.AF_INET6 if ":" in host else _socket.AF_INET, host)
        return None
    except OSError:
        pass
    # C strips nothing: " 10.0.0.1" or "[::1]" go to getaddrinfo as names.
    if host.strip() == host and not host.startswith("[") and parse_ip(host) is not None:
        return None
    return host


def _port(address: tuple[Any, ...]) -> object:
    return address[1] if len(address) > 1 else None


def _wrap(name: str, original: Callable[..., Any],
          pick: Callable[[tuple[Any, ...]], object]) -> Callable[..., Any]:
    def checked(self: socket.socket, *args: Any) -> Any:
        address = pick(args)
        host = resolved_name(address)
        if host is not None and _socket.socket.family.__get__(self) in _INET_FAMILIES:
            assert isinstance(address, tuple)
            sys.audit(RESOLVE_EVENT, name, self, host, _port(address))
        return original(self, *args)

    checked.__name__ = checked.__qualname__ = name
    checked.__doc__ = original.__doc__
    setattr(checked, _MARK, True)
    return checked


def _last(args: tuple[Any, ...]) -> object:
    return args[-1] if args else None


def _fourth(args: tuple[Any, ...]) -> object:
    return args[3] if len(args) > 3 else None


_METHODS: dict[str, Callable[[tuple[Any, ...]], object]] = {
    "connect": _last,      # connect(address)
    "connect_ex": _last,   # connect_ex(address)
    "bind": _last,         # bind(address)
    "sendto": _last,       # sendto(data, address) / sendto(data, flags, address)
    "sendmsg": _fourth,    # sendmsg(buffers, ancdata, flags, address) -- positional only
}


def install() -> None:
    """Wrap the name-resolving methods of :class:`socket.socket` (idempotent, process-wide)."""
    for name, pick in _METHODS.items():
        if getattr(getattr(socket.socket, name), _MARK, False):
            continue
        setattr(socket.socket, name, _wrap(name, getattr(socket.socket, name), pick))


def installed() -> bool:
    """Whether every wrapper is still in place (another library may have replaced one)."""
    return all(getattr(getattr(socket.socket, name), _MARK, False) for name in _METHODS)
