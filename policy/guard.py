"""The process egress guard: a ``sys.addaudithook`` hook that blocks connections no policy allows.

CPython raises an audit event before every ``socket.getaddrinfo`` and ``socket.connect``
(also ``sendto``/``sendmsg`` with an address, and the ``gethostbyname`` family) made from
anywhere in the process, third-party libraries included, and an exception raised by a hook
aborts the call (PEP 578). The guard checks each such event with an
:class:`~policy.egress.EgressMatcher`; in ``enforce`` mode a refused event raises
:class:`~policy.errors.EgressDenied`, in ``monitor`` mode it is only recorded. Every refusal is
delivered to ``on_event`` as an :class:`EgressEvent` (the audit log records them).

DNS is a data channel (a name such as ``<secret>.evil.example`` reaches the attacker's name
server), so name resolution is checked before any query is sent:

* ``socket.getaddrinfo`` and ``socket.gethostbyname`` (also raised by ``gethostbyname_ex``):
  only names a destination names (and ``localhost``) may be resolved;
* ``socket.gethostbyaddr`` and ``socket.getnameinfo`` are reverse lookups (PTR queries) and
  always refused (``unsafe_allow_all`` aside); ``socket.getfqdn`` then returns its argument;
* ``connect``/``connect_ex``/``sendto``/``sendmsg``/``bind`` with a host name resolve it in C
  *before* their audit event: :mod:`policy.resolution` wraps these methods of
  :class:`socket.socket` to raise :data:`~policy.resolution.RESOLVE_EVENT` first, and the guard
  refuses (``socket.__new__``) inet sockets of the bare C type ``_socket.socket``, which the
  wrappers do not reach. A name that still arrives with a ``connect``-family event (the C method
  called unbound, ``_socket.socket.connect(sock, (name, port))``) has been resolved already: the
  connection is refused and recorded, the query cannot be taken back (docs/policy.md).

Limits (measured, see shared/FORMATS.md): uvloop and other C-level event loops connect without
these events, so the gateway runs the standard asyncio loop while the guard is on and refuses to
start unless :meth:`EgressGuard.self_test` shows a denied connection is blocked. C extensions that
open sockets or resolve themselves (c-ares, libpq) and child processes are invisible to the
guard; the Kubernetes NetworkPolicy rendered from the same policy (``policy networkpolicy``) and
the Cilium DNS rules are the outer layer.

Audit hooks cannot be removed, so :meth:`EgressGuard.install` adds a hook that consults a state
cell; :meth:`EgressGuard.uninstall` empties the cell and the hook becomes a no-op.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, Literal

from . import resolution
from .egress import EgressMatcher, PinStore, port_number, system_resolve
from .errors import EgressBlocked, EgressDenied, GuardSelfTestFailed
from .evaluate import Policy

_log = logging.getLogger(__name__)

Mode = Literal["enforce", "monitor"]

# Every socket audit event of CPython 3.11 that can send a name or an address off the host
# (socket.gethostname, sethostname, getservbyname and getservbyport cannot).
_LOOKUP_EVENTS = frozenset({"socket.getaddrinfo", "socket.gethostbyname"})
_REVERSE_EVENTS = frozenset({"socket.gethostbyaddr", "socket.getnameinfo"})
_CONNECT_EVENTS = frozenset({"socket.connect", "socket.sendto", "socket.sendmsg"})
_NEW_EVENT = "socket.__new__"
_BIND_EVENT = "socket.bind"
_EVENTS = (_LOOKUP_EVENTS | _REVERSE_EVENTS | _CONNECT_EVENTS
           | {_NEW_EVENT, _BIND_EVENT, resolution.RESOLVE_EVENT})
# A socket created with fileno= is audited with family -1 (detected after the event).
_RAW_CHECKED_FAMILIES = frozenset({socket.AF_INET, socket.AF_INET6, -1})
_INTERNAL_PREFIXES = ("socket", "asyncio", "selectors", "concurrent", "threading", "ssl",
                      "policy.guard", "policy.egress", "policy.resolution")

_AFTER_RESOLUTION = ("the name was resolved in C before the guard saw it (unbound _socket "
                     "method): the DNS query has left, the connection is refused")

#: The self-test target: TEST-NET-1 (RFC 5737), never routed, port 9 (discard).
SELF_TEST_TARGET = ("192.0.2.1", 9)


@dataclass(frozen=True, slots=True)
class EgressEvent:
    """One checked egress attempt.

    Attributes:
        time: Unix time in seconds.
        host: host as the caller gave it (name or address literal).
        port: TCP/UDP port, or ``None`` when the call gave none.
        address: canonical address for connections, ``None`` for name lookups.
        decision: ``"deny"`` (blocked), ``"monitor"`` (would be blocked, monitor mode) or
            ``"allow"`` (only delivered with ``record_allowed=True``).
        destination_id: the destination that allowed it, if any.
        caller: ``module:function:line`` of the first frame outside socket/asyncio internals.
        reason: why it was refused or which destination allowed it.
        event: the audit event name (``socket.connect``, ``socket.getaddrinfo``, ...).
    """

    time: float
    host: str
    port: int | None
    address: str | None
    decision: Literal["allow", "deny", "monitor"]
    destination_id: str | None
    caller: str
    reason: str = ""
    event: str = ""

    def as_record(self) -> dict[str, Any]:
        """Return the JSON-ready form for audit records."""
        return {
            "type": "egress", "time": self.time, "host": self.host, "port": self.port,
            "address": self.address, "decision": self.decision,
            "destination": self.destination_id, "caller": self.caller, "reason": self.reason,
            "event": self.event,
        }


def _caller(frame: FrameType | None) -> str:
    while frame is not None:
        mod = str(frame.f_globals.get("__name__", "?"))
        if not mod.startswith(_INTERNAL_PREFIXES):
            return f"{mod}:{frame.f_code.co_name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class _Cell:
    """What an installed hook consults; ``guard`` is ``None`` once uninstalled."""

    __slots__ = ("guard",)

    def __init__(self, guard: EgressGuard) -> None:
        self.guard: EgressGuard | None = guard


class EgressGuard:
    """Blocks (``enforce``) or records (``monitor``) egress that no destination allows.

    Args:
        policy: the policy whose destinations are allowed.
        mode: ``"enforce"`` (default) or ``"monitor"``.
        on_event: called with every refused :class:`EgressEvent` (and allowed ones when
            ``record_allowed``); must not raise or do network I/O.
        pins: pin store shared with the transport (a new one by default).
        resolver: resolves hostname destinations for pinning (default: system getaddrinfo).
        record_allowed: also deliver allowed connections to ``on_event``.
        max_events: how many recent events :attr:`events` keeps.
    """

    def __init__(
        self,
        policy: Policy,
        mode: Mode = "enforce",
        on_event: Callable[[EgressEvent], None] | None = None,
        *,
        pins: PinStore | None = None,
        resolver: Callable[[str, int], list[str]] = system_resolve,
        record_allowed: bool = False,
        max_events: int = 1000,
    ) -> None:
        if mode not in ("enforce", "monitor"):
            raise ValueError(f"mode must be 'enforce' or 'monitor', not {mode!r}")
        self.matcher = EgressMatcher(policy, pins)
        self.mode: Mode = mode
        self.on_event = on_event
        self.record_allowed = record_allowed
        self.events: collections.deque[EgressEvent] = collections.deque(maxlen=max_events)
        self._resolver = resolver
        self._local = threading.local()
        self._cell: _Cell | None = None
        self._probe: tuple[str, int] | None = None

    @property
    def pins(self) -> PinStore:
        """The pin store (share it with :func:`policy.transport.make_connector`)."""
        return self.matcher.pins

    @property
    def installed(self) -> bool:
        """Whether the guard's hook is active."""
        return self._cell is not None

    def install(self) -> EgressGuard:
        """Activate the guard for the whole process (idempotent). Returns ``self``."""
        if self._cell is not None:
            return self
        cell = _Cell(self)

        def hook(event: str, args: tuple[Any, ...]) -> None:
            # Called for every audit event in the process: leave non-socket events first.
            if event not in _EVENTS:
                return
            guard = cell.guard
            if guard is not None:
                guard._on_audit(event, args)

        resolution.install()
        sys.addaudithook(hook)
        self._cell = cell
        if self.matcher.policy.unsafe_allow_all:
            _log.warning("egress guard installed with unsafe_allow_all: nothing is blocked")
        return self

    def uninstall(self) -> None:
        """Deactivate the guard (the hook stays registered as a no-op; PEP 578)."""
        if self._cell is not None:
            self._cell.guard = None
            self._cell = None

    def __enter__(self) -> EgressGuard:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # --- the hook --------------------------------------------------------------------------

    def _on_audit(self, event: str, args: tuple[Any, ...]) -> None:
        if getattr(self._local, "busy", False):
            return  # our own pinning lookup
        if event in _LOOKUP_EVENTS:
            host = args[0]
            port = port_number(args[1]) if event == "socket.getaddrinfo" else None
            if isinstance(host, bytes):
                host = host.decode("ascii", "replace")
            if host is None:
                return
            self._check_lookup(event, str(host), port)
            return
        if event == resolution.RESOLVE_EVENT:
            # A socket.socket method about to resolve a name in C (policy.resolution).
            method, _sock, host, port = args
            self._check_lookup(f"socket.{method}", host, port_number(port))
            return
        if event in _REVERSE_EVENTS:
            self._check_reverse(event, args[0])
            return
        if event == _NEW_EVENT:
            self._check_new(args)
            return
        sock, address = args[0], args[1]
        if address is None or getattr(sock, "family", None) not in (
            socket.AF_INET, socket.AF_INET6,
        ):
            return  # AF_UNIX and friends: not network egress
        name = resolution.resolved_name(address)
        if event == _BIND_EVENT:
            if name is not None:
                # Only the unbound C method gets here with a name: it is resolved already.
                self._check_lookup(event, name, None, after_resolution=True)
            return  # binding a local address sends nothing
        host, port = str(address[0]), port_number(address[1])
        verdict = self.matcher.check_connect(host, port)
        reason = verdict.reason
        if name is not None and not verdict.allowed:
            lookup = self.matcher.check_lookup(name, port)
            if not lookup.allowed:
                reason = f"{lookup.reason}; {_AFTER_RESOLUTION}"
        probe = self._probe is not None and self._probe == (verdict.address, port)
        self._decide(event, host, port, verdict.address, verdict.allowed and not probe,
                     verdict.destination_id, reason, force_block=probe)

    def _check_reverse(self, event: str, target: object) -> None:
        if isinstance(target, tuple) and target:  # getnameinfo((host, port[, ...]))
            host, port = str(target[0]), port_number(target[1]) if len(target) > 1 else None
        else:
            host, port = str(target), None
        verdict = self.matcher.check_reverse(host)
        self._decide(event, host, port, None, verdict.allowed, None, verdict.reason)

    def _check_new(self, args: tuple[Any, ...]) -> None:
        sock, family = args[0], args[1]
        if isinstance(sock, socket.socket) or family not in _RAW_CHECKED_FAMILIES:
            return
        if self.matcher.policy.unsafe_allow_all:
            return
        kind = f"{type(sock).__module__}.{type(sock).__qualname__}"
        self._decide(_NEW_EVENT, "", None, None, False, None,
                     f"inet socket of the C type {kind} (not socket.socket): its connect/sendto "
                     "resolve names before the guard can check them")

    def _check_lookup(self, event: str, host: str, port: int | None, *,
                      after_resolution: bool = False) -> None:
        verdict = self.matcher.check_lookup(host, port)
        dest_id, reason, allowed = verdict.destination_id, verdict.reason, verdict.allowed
        if allowed and dest_id is None:
            return  # address literal or local name: nothing leaves the host, connect is checked
        if after_resolution and not allowed:
            reason = f"{reason}; {_AFTER_RESOLUTION}"
        if allowed and dest_id is not None:
            dest = self.matcher.policy.destinations[dest_id]
            pin_port = port if port is not None else min(dest.endpoint.ports)
            self._local.busy = True
            try:
                self.matcher.pin(dest, pin_port, self._resolver)
            except EgressDenied as exc:
                allowed, reason = False, exc.reason
            except OSError:
                pass  # the caller's own lookup will fail the same way
            finally:
                self._local.busy = False
        self._decide(event, host, port, None, allowed, dest_id, reason)

    def _decide(
        self, event: str, host: str, port: int | None, address: str | None, allowed: bool,
        dest_id: str | None, reason: str, *, force_block: bool = False,
    ) -> None:
        if allowed and not self.record_allowed:
            return
        block = force_block or (not allowed and self.mode == "enforce")
        decision: Literal["allow", "deny", "monitor"] = (
            "allow" if allowed else ("deny" if block else "monitor")
        )
        ev = EgressEvent(time.time(), host, port, address, decision, dest_id,
                         _caller(sys._getframe(2)), reason, event)
        if not force_block:
            self.events.append(ev)
            if not allowed:
                _log.warning("egress %s: %s:%s (%s) from %s", decision, host, port, reason,
                             ev.caller)
            self._deliver(ev)
        if block:
            raise EgressBlocked(host, port, reason if not force_block else "guard self-test probe")

    def _deliver(self, ev: EgressEvent) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(ev)
        except Exception:
            # A failing recorder must neither break the caller's socket call nor, in enforce
            # mode, turn a block into an allow: log it and go on.
            _log.exception("egress guard on_event callback failed for %s:%s", ev.host, ev.port)

    # --- self-test -------------------------------------------------------------------------

    def _prepare_probe(self, target: tuple[str, int]) -> None:
        if not self.installed:
            raise GuardSelfTestFailed("egress guard self-test: the guard is not installed")
        if not resolution.installed():
            raise GuardSelfTestFailed(
                "egress guard self-test: socket.socket's name checks (policy.resolution) were "
                "replaced by other code, so connect((name, port)) would resolve unchecked"
            )
        verdict = self.matcher.check_connect(*target)
        if verdict.allowed:
            raise GuardSelfTestFailed(
                f"egress guard self-test: target {target[0]}:{target[1]} is allowed by the "
                "policy, pick a denied address"
            )
        self._probe = (verdict.address or target[0], target[1])

    def self_test(self, target: tuple[str, int] = SELF_TEST_TARGET, timeout_s: float = 2.0) -> None:
        """Prove the hook blocks a connection to a denied address (blocking socket API).

        Raises:
            GuardSelfTestFailed: the connection was not blocked by the guard.
        """
        self._prepare_probe(target)
        try:
            with socket.create_connection(target, timeout=timeout_s):
                pass
        except EgressDenied:
            return
        except OSError as exc:
            raise GuardSelfTestFailed(
                f"egress guard self-test: connection to {target[0]}:{target[1]} was not blocked "
                f"by the guard ({exc.__class__.__name__}: {exc})"
            ) from exc
        finally:
            self._probe = None
        raise GuardSelfTestFailed(
            f"egress guard self-test: connection to {target[0]}:{target[1]} succeeded"
        )

    async def aself_test(
        self, target: tuple[str, int] = SELF_TEST_TARGET, timeout_s: float = 2.0
    ) -> None:
        """Prove the hook blocks a connection made through the running event loop.

        Under uvloop the loop connects in C without audit events, so this fails there.

        Raises:
            GuardSelfTestFailed: the connection was not blocked by the guard.
        """
        self._prepare_probe(target)
        loop = asyncio.get_running_loop()
        loop_name = f"{type(loop).__module__}.{type(loop).__qualname__}"
        try:
            transport, _ = await asyncio.wait_for(
                loop.create_connection(asyncio.Protocol, target[0], target[1]), timeout_s
            )
            transport.close()
        except EgressDenied:
            return
        except (OSError, TimeoutError) as exc:
            raise GuardSelfTestFailed(
                f"egress guard self-test: connection to {target[0]}:{target[1]} through the "
                f"{loop_name} event loop was not blocked by the guard "
                f"({exc.__class__.__name__}: {exc}); run the standard asyncio loop, not uvloop"
            ) from exc
        finally:
            self._probe = None
        raise GuardSelfTestFailed(
            f"egress guard self-test: connection through {loop_name} succeeded"
        )
