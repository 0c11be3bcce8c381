"""Address-level egress checks shared by the transport and the process guard.

:class:`EgressMatcher` answers two questions for a :class:`~policy.evaluate.Policy`:

* may this host be *resolved* (a DNS lookup is itself egress, and a channel for data), and
* may the process *connect* to this address and port?

Hostname destinations are pinned: the first resolution is checked (every address must lie in
the destination's ``resolves_to`` networks, or, without them, must be neither always-denied nor
loopback) and recorded in a :class:`PinStore`; later connections are allowed only to pinned
addresses, so DNS rebinding cannot move a connection elsewhere. Address and CIDR destinations
check the address itself. Addresses in :data:`~policy.addresses.ALWAYS_DENIED` are refused
unless a destination names them (as its address or inside its CIDR).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from .addresses import IPAddress, always_denied_reason, canonical_ip, parse_host, parse_ip
from .errors import EgressDenied
from .evaluate import Policy
from .model import Destination

#: Resolve ``(hostname, port)`` to addresses (strings as returned by getaddrinfo).
SyncResolver = Callable[[str, int], list[str]]
#: The same, awaited (what :func:`check_target` asks; each transport adapts its resolver).
AsyncResolver = Callable[[str, int], Awaitable[list[str]]]

#: Names that resolve on the host itself (``/etc/hosts``): resolving them sends no traffic.
LOCAL_NAMES = frozenset({"localhost"})

_CONNECT_CACHE_MAX = 4096


@dataclass(frozen=True, slots=True)
class Verdict:
    """Outcome of one address-level check.

    Attributes:
        allowed: whether the lookup or connection may proceed.
        destination_id: the destination that allows it, if any.
        reason: explanation (why refused, or which destination allowed it).
        address: canonical address checked (``None`` for a name lookup).
    """

    allowed: bool
    destination_id: str | None
    reason: str
    address: str | None = None


class PinStore:
    """Thread-safe record of the addresses each hostname destination resolved to (first wins)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pins: dict[str, frozenset[IPAddress]] = {}
        self._by_ip: dict[IPAddress, frozenset[str]] = {}
        #: Incremented on every new pin; caches of connect verdicts are keyed by it.
        self.generation = 0

    def get(self, hostname: str) -> frozenset[IPAddress] | None:
        """Return the pinned addresses of a (normalised) hostname, or ``None``."""
        return self._pins.get(hostname)

    def pin(self, hostname: str, addresses: Iterable[IPAddress]) -> frozenset[IPAddress]:
        """Pin ``hostname`` to ``addresses`` unless it is pinned already; return the pins."""
        with self._lock:
            current = self._pins.get(hostname)
            if current is not None:
                return current
            pinned = frozenset(addresses)
            self._pins[hostname] = pinned
            for ip in pinned:
                self._by_ip[ip] = self._by_ip.get(ip, frozenset()) | {hostname}
            self.generation += 1
            return pinned

    def hostnames_for(self, ip: IPAddress) -> frozenset[str]:
        """Return the hostnames pinned to ``ip``."""
        return self._by_ip.get(ip, frozenset())


def system_resolve(hostname: str, port: int) -> list[str]:
    """Resolve with the system resolver (``socket.getaddrinfo``), TCP only."""
    infos = socket.getaddrinfo(hostname, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def port_number(port: object) -> int | None:
    """Return a port from a getaddrinfo/connect argument (int, digit string, service name)."""
    if isinstance(port, int):
        return port or None
    if isinstance(port, bytes):
        port = port.decode("ascii", "replace")
    if isinstance(port, str):
        if port.isdigit():
            return int(port) or None
        return {"http": 80, "https": 443}.get(port.lower())
    return None


class EgressMatcher:
    """Answers lookup and connect checks for one policy revision and one pin store."""

    def __init__(self, policy: Policy, pins: PinStore | None = None) -> None:
        self.policy = policy
        self.pins = pins if pins is not None else PinStore()
        self._networks = [
            d for d in policy.document.destinations if d.endpoint.network is not None
        ]
        self._connect_cache: dict[tuple[str, int | None], tuple[int, Verdict]] = {}
        self._by_hostname: dict[str, list[Destination]] = {}
        for d in policy.document.destinations:
            if d.endpoint.hostname is not None:
                self._by_hostname.setdefault(d.endpoint.hostname, []).append(d)

    def hostname_destination(self, hostname: str, port: int | None) -> Destination | None:
        """Return the destination naming this (normalised) hostname and port, if any."""
        for d in self._by_hostname.get(hostname, ()):
            if port is None or port in d.endpoint.ports:
                return d
        return None

    def check_lookup(self, host: str | None, port: int | None) -> Verdict:
        """May ``host`` be resolved? Address literals and local names always may (no traffic)."""
        if host is None or host == "":
            return Verdict(True, None, "no host (local or passive lookup)")
        try:
            parsed = parse_host(host)
        except ValueError:
            return Verdict(False, None, f"{host!r} is not a valid hostname")
        if not isinstance(parsed, str):
            return Verdict(True, None, "address literal: checked at connect", str(parsed))
        dest = self.hostname_destination(parsed, port)
        if dest is not None:
            return Verdict(True, dest.id, f"hostname of destination {dest.id}")
        if parsed in LOCAL_NAMES:
            return Verdict(True, None, "local name: checked at connect")
        if self.policy.unsafe_allow_all:
            return Verdict(True, None, "unsafe_allow_all")
        where = parsed if port is None else f"{parsed}:{port}"
        return Verdict(False, None, f"no destination names {where}")

    def check_reverse(self, host: str) -> Verdict:
        """May ``host`` (an address, or a name to resolve first) be looked up in reverse?

        Never, unless ``unsafe_allow_all``: a PTR query carries the address (or name) to
        whichever name server answers for it, and no destination is reached by one.
        """
        if self.policy.unsafe_allow_all:
            return Verdict(True, None, "unsafe_allow_all")
        return Verdict(False, None, f"reverse lookup of {host!r}: a PTR query is a DNS channel "
                                    "and no policy destination needs one")

    def check_resolved(self, dest: Destination, addresses: Iterable[str]) -> list[IPAddress]:
        """Check every address a hostname destination resolved to; return them canonical.

        Raises:
            EgressDenied: an address is outside ``resolves_to``, or (without it) is always
                denied or loopback; or nothing was resolved.
        """
        hostname = dest.endpoint.hostname or dest.id
        out: list[IPAddress] = []
        for text in addresses:
            ip = parse_ip(text)
            if ip is None:
                raise EgressDenied(hostname, None, f"resolver returned a non-address {text!r}")
            ip = canonical_ip(ip)
            nets = dest.endpoint.resolves_to
            if nets:
                if not any(ip.version == n.version and ip in n for n in nets):
                    raise EgressDenied(
                        hostname, None,
                        f"resolved to {ip}, outside resolves_to of destination {dest.id}",
                    )
            else:
                bad = always_denied_reason(ip)
                if bad is None and ip.is_loopback and hostname not in LOCAL_NAMES:
                    bad = "loopback (add resolves_to to allow it)"
                if bad is not None:
                    raise EgressDenied(
                        hostname, None, f"resolved to {ip} ({bad}) for destination {dest.id}"
                    )
            out.append(ip)
        if not out:
            raise EgressDenied(hostname, None, "resolved to no address")
        return out

    def pin(self, dest: Destination, port: int, resolve: SyncResolver) -> frozenset[IPAddress]:
        """Return the pinned addresses of a hostname destination, resolving once if needed.

        Raises:
            EgressDenied: the resolution failed the checks of :meth:`check_resolved`.
            OSError: the resolver failed.
        """
        hostname = dest.endpoint.hostname
        assert hostname is not None
        pinned = self.pins.get(hostname)
        if pinned is None:
            pinned = self.pins.pin(hostname, self.check_resolved(dest, resolve(hostname, port)))
        return pinned

    def check_connect(self, host: str, port: int | None) -> Verdict:
        """May the process connect to ``host:port``? ``host`` must be an address literal.

        Verdicts are cached per ``(host, port)`` until the pin store changes.
        """
        key = (host, port)
        generation = self.pins.generation
        hit = self._connect_cache.get(key)
        if hit is not None and hit[0] == generation:
            return hit[1]
        verdict = self._check_connect(host, port)
        if len(self._connect_cache) >= _CONNECT_CACHE_MAX:
            self._connect_cache.clear()
        self._connect_cache[key] = (generation, verdict)
        return verdict

    def _check_connect(self, host: str, port: int | None) -> Verdict:
        ip = parse_ip(host)
        if ip is None:
            if self.policy.unsafe_allow_all:
                return Verdict(True, None, "unsafe_allow_all")
            return Verdict(False, None, f"connect to unresolved name {host!r} bypasses pinning")
        ip = canonical_ip(ip)
        address = str(ip)
        for d in self._networks:
            net = d.endpoint.network
            assert net is not None
            if ip.version == net.version and ip in net and port in d.endpoint.ports:
                return Verdict(True, d.id, f"address of destination {d.id}", address)
        denied = always_denied_reason(ip)
        if denied is not None:
            return Verdict(False, None, f"{address} is always denied ({denied})", address)
        for hostname in self.pins.hostnames_for(ip):
            dest = self.hostname_destination(hostname, port)
            if dest is not None:
                return Verdict(True, dest.id, f"pinned address of {hostname}", address)
        if self.policy.unsafe_allow_all:
            return Verdict(True, None, "unsafe_allow_all", address)
        shown = f"[{address}]:{port}" if ip.version == 6 else f"{address}:{port}"
        return Verdict(False, None, f"no destination allows {shown}", address)


@dataclass(frozen=True, slots=True)
class Target:
    """Where a policy-checked client may connect for one ``host:port``.

    Attributes:
        hostname: the normalised name to send as ``Host`` and TLS SNI, ``None`` for an address
            literal.
        addresses: the checked addresses, IPv4 first then by value (never empty).
        destination_id: the destination that allows it (``None`` under ``unsafe_allow_all``).
    """

    hostname: str | None
    addresses: tuple[IPAddress, ...]
    destination_id: str | None


def _ordered(addresses: Iterable[IPAddress]) -> tuple[IPAddress, ...]:
    return tuple(sorted(addresses, key=lambda ip: (ip.version, int(ip))))


def admit_host(matcher: EgressMatcher, host: str, port: int) -> IPAddress | str:
    """The check made before any I/O: may a client ask for ``host:port`` at all?

    Args:
        matcher: the policy's matcher.
        host: the URL's host as given (name or address literal, brackets allowed).
        port: the URL's port (the scheme's default when the URL has none).

    Returns:
        The checked address of an address literal, or the normalised name that may be resolved
        (a destination names it, or ``unsafe_allow_all``).

    Raises:
        EgressDenied: invalid host, a literal no destination allows (always-denied ranges even
            under ``unsafe_allow_all``), or a name no destination names.
    """
    try:
        parsed = parse_host(host)
    except ValueError:
        raise EgressDenied(host, port, "not a valid hostname") from None
    if not isinstance(parsed, str):
        verdict = matcher.check_connect(str(parsed), port)
        if not verdict.allowed:
            raise EgressDenied(host, port, verdict.reason)
        return parsed
    if matcher.hostname_destination(parsed, port) is None and not matcher.policy.unsafe_allow_all:
        raise EgressDenied(host, port, f"no destination names {parsed}:{port}")
    return parsed


async def check_target(
    matcher: EgressMatcher, host: str, port: int, resolve: AsyncResolver
) -> Target:
    """The one egress check of every policy-checked transport (aiohttp and httpx).

    A name no destination names is refused without a DNS query. A hostname destination is
    resolved once (``resolve``), every address checked against the destination
    (:meth:`EgressMatcher.check_resolved`) and pinned; later calls return the pins without
    asking DNS again, so rebinding cannot move a connection. Under ``unsafe_allow_all`` a name
    no destination names is resolved each time, unpinned, and its addresses only checked
    against the always-denied ranges (as the process guard checks the connection).

    Args:
        matcher: the policy's matcher (its pin store is shared with the process guard).
        host: the URL's host as given.
        port: the URL's port (the scheme's default when the URL has none).
        resolve: awaitable resolver ``(name, port) -> [address text, ...]``.

    Returns:
        The checked :class:`Target`.

    Raises:
        EgressDenied: see :func:`admit_host`; or a resolved address fails the checks.
        OSError: the resolver failed.
    """
    admitted = admit_host(matcher, host, port)
    if not isinstance(admitted, str):
        verdict = matcher.check_connect(str(admitted), port)
        return Target(None, (admitted,), verdict.destination_id)
    dest = matcher.hostname_destination(admitted, port)
    if dest is None:  # unsafe_allow_all
        addresses: list[IPAddress] = []
        for text in await resolve(admitted, port):
            ip = parse_ip(text)
            verdict = matcher.check_connect(text, port)
            if ip is None or not verdict.allowed:
                raise EgressDenied(host, port, verdict.reason)
            addresses.append(canonical_ip(ip))
        if not addresses:
            raise EgressDenied(host, port, "resolved to no address")
        return Target(admitted, _ordered(addresses), None)
    pinned = matcher.pins.get(admitted)
    if pinned is None:
        checked = matcher.check_resolved(dest, await resolve(admitted, port))
        pinned = matcher.pins.pin(admitted, checked)
    return Target(admitted, _ordered(pinned), dest.id)
