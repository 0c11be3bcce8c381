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
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .addresses import IPAddress, always_denied_reason, canonical_ip, parse_host, parse_ip
from .errors import EgressDenied
from .evaluate import Policy
from .model import Destination

#: Resolve ``(hostname, port)`` to addresses (strings as returned by getaddrinfo).
SyncResolver = Callable[[str, int], list[str]]

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
