"""Policy-checked outbound HTTP for aiohttp: a pinning resolver, a connector and a session.

Layer 2 of enforcement. For every request:

1. the session middleware refuses proxies and checks the URL's host and port against the
   policy (aiohttp skips the resolver for address literals, so they are checked here);
   the connector checks every address again when it opens a connection
   (:func:`checked_socket_factory`), so a client without the middleware (the gateway's relay
   session, which checks per connection rather than per request) is held to the same policy;
2. :class:`PolicyResolver` resolves a hostname destination once, checks every address
   (:meth:`~policy.egress.EgressMatcher.check_resolved`) and pins it; later lookups return the
   pinned addresses without asking DNS again, so rebinding cannot move a connection. aiohttp
   then connects to the checked address and sends the original name as Host header and TLS SNI;
3. a redirect answer is never followed: it raises :class:`~policy.errors.RedirectRefused`;
4. ``trust_env`` is off: ``HTTP(S)_PROXY``, ``NO_PROXY`` and ``.netrc`` are ignored.

Steps 1 and 2 are :func:`~policy.egress.admit_host` and :func:`~policy.egress.check_target`,
the egress check shared with the httpx transport (one implementation, so both decide alike).

aiohttp wraps resolver and connect errors in its own exceptions; the middleware unwraps them, so
callers see :class:`~policy.errors.EgressDenied` (the boundary mapping of CONVENTIONS.md).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_middlewares import ClientHandlerType, ClientMiddlewareType

from .addresses import always_denied_reason, parse_ip
from .egress import EgressMatcher, PinStore, admit_host, check_target
from .errors import EgressDenied, RedirectRefused
from .evaluate import Policy

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
"""HTTP statuses of a redirect (never followed by a policy-checked client)."""


def _matcher(policy: Policy | EgressMatcher, pins: PinStore | None) -> EgressMatcher:
    if isinstance(policy, EgressMatcher):
        return policy
    return EgressMatcher(policy, pins)


class PolicyResolver(AbstractResolver):
    """Resolve only hosts a destination names; check and pin what they resolve to.

    Args:
        matcher: the policy's egress matcher (its pin store is shared with the process guard).
        resolver: the resolver asked for hostname destinations (default aiohttp's
            ``ThreadedResolver``, i.e. the system ``getaddrinfo``); tests inject their own.
    """

    def __init__(self, matcher: EgressMatcher, resolver: AbstractResolver | None = None) -> None:
        self.matcher = matcher
        self._base = resolver

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """Return the checked (pinned) addresses of ``host`` (:func:`~policy.egress.check_target`).

        Raises:
            EgressDenied: no destination names ``host:port``, or a resolved address fails the
                destination's checks.
            OSError: the underlying resolver failed.
        """

        async def base(name: str, at_port: int) -> list[str]:
            return [i["host"] for i in await self._resolver().resolve(name, at_port, family)]

        target = await check_target(self.matcher, host, port, base)
        wanted = {socket.AF_INET: 4, socket.AF_INET6: 6}.get(family)
        results: list[ResolveResult] = [
            {
                "hostname": host,
                "host": str(ip),
                "port": port,
                "family": socket.AF_INET if ip.version == 4 else socket.AF_INET6,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
            for ip in target.addresses
            if wanted is None or ip.version == wanted
        ]
        if not results:
            raise EgressDenied(host, port, "no checked address of the requested family")
        return results

    def _resolver(self) -> AbstractResolver:
        if self._base is None:
            self._base = aiohttp.ThreadedResolver()
        return self._base

    async def close(self) -> None:
        """Close the underlying resolver."""
        if self._base is not None:
            await self._base.close()


def _egress_cause(exc: BaseException) -> EgressDenied | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, EgressDenied):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def redirect_refused(host: str, port: int | None, status: int, location: str) -> RedirectRefused:
    """The refusal of a redirect answer (``status`` in :data:`REDIRECT_STATUSES`).

    Args:
        host: The host the request went to.
        port: Its port.
        status: The redirect status.
        location: The ``Location`` header (shown, never followed).
    """
    return RedirectRefused(
        host, port, f"upstream answered {status} redirect to {location!r}; "
        "policy-checked clients never follow redirects",
    )


def policy_middleware(matcher: EgressMatcher) -> ClientMiddlewareType:
    """Return an aiohttp client middleware enforcing the policy on every request and hop.

    Raises (from the request):
        EgressDenied: proxy requested, or host/port not allowed (also when the resolver or the
            process guard refused; aiohttp's wrapping is removed).
        RedirectRefused: the upstream answered 301/302/303/307/308.
    """

    async def middleware(req: aiohttp.ClientRequest, handler: ClientHandlerType) -> Any:
        host = req.url.raw_host or ""
        port = req.url.port
        if req.proxy is not None:
            raise EgressDenied(host, port, "policy-checked clients never use a proxy")
        # aiohttp never asks the resolver for an address literal: check it here (names are
        # refused here too, before any lookup, with the same verdict as the resolver's).
        admit_host(matcher, host, port or 0)
        try:
            resp = await handler(req)
        except aiohttp.ClientError as exc:
            cause = _egress_cause(exc)
            if cause is not None:
                raise cause from None
            raise
        if resp.status in REDIRECT_STATUSES:
            location = resp.headers.get("Location", "")
            resp.release()
            raise redirect_refused(host, port, resp.status, location)
        return resp

    return middleware


def make_connector(
    policy: Policy | EgressMatcher,
    *,
    pins: PinStore | None = None,
    resolver: AbstractResolver | None = None,
    **kwargs: Any,
) -> aiohttp.TCPConnector:
    """Return a ``TCPConnector`` whose lookups go through :class:`PolicyResolver`.

    Args:
        policy: the policy (or a prepared matcher).
        pins: pin store to share with the process guard (``guard.pins``).
        resolver: underlying resolver (default: system getaddrinfo in a thread).
        **kwargs: passed to ``aiohttp.TCPConnector`` (``limit``, ``ssl``, ...).
    """
    matcher = _matcher(policy, pins)
    kwargs.setdefault("use_dns_cache", False)  # pinning is the cache
    return aiohttp.TCPConnector(resolver=PolicyResolver(matcher, resolver),
                                socket_factory=checked_socket_factory(matcher), **kwargs)


def checked_socket_factory(matcher: EgressMatcher) -> Callable[[AddrInfoType], socket.socket]:
    """Return an aiohttp ``socket_factory`` that checks every address before connecting.

    aiohttp calls it once per connection attempt with the address it is about to connect to
    (an address literal from the URL, or an address :class:`PolicyResolver` checked and
    pinned), so every new connection is checked at connect time
    (:meth:`~policy.egress.EgressMatcher.check_connect`), with or without
    :func:`policy_middleware`. Pooled connections were checked when they were opened (the
    policy of a running process does not change).

    Raises (from the connection attempt):
        EgressDenied: no destination allows the address and port (not an ``OSError``, so
            aiohttp passes it through unwrapped).
    """

    def factory(addr_info: AddrInfoType) -> socket.socket:
        family, type_, proto, _, address = addr_info
        host, port = str(address[0]), int(address[1])
        verdict = matcher.check_connect(host, port)
        if not verdict.allowed:
            raise EgressDenied(host, port, verdict.reason)
        return socket.socket(family=family, type=type_, proto=proto)

    return factory


_KNOWN_ADDRESSES_MAX = 1024
"""Address literals whose always-denied answer a :func:`denied_address_socket_factory` keeps."""


def denied_address_socket_factory() -> Callable[[AddrInfoType], socket.socket]:
    """Return an aiohttp ``socket_factory`` that refuses the always-denied addresses
    (:func:`~policy.addresses.always_denied_reason`: link-local and the cloud metadata
    services, "this host", broadcast, multicast) at connect time, with no policy configured.

    The check runs on the address aiohttp is about to connect to, after resolution, so a name
    that resolves to ``169.254.169.254`` is refused like the literal, before anything is sent.
    With a policy, :func:`checked_socket_factory` does this and more.

    Raises (from the connection attempt):
        EgressDenied: the address is always denied.
    """

    # The answer depends on the address alone: remembered per address literal (a burst of new
    # upstream connections to one replica parses and tests it once, not ~10 us per connection).
    known: dict[str, str | None] = {}

    def factory(addr_info: AddrInfoType) -> socket.socket:
        family, type_, proto, _, address = addr_info
        host, port = str(address[0]), int(address[1])
        try:
            reason = known[host]
        except KeyError:
            ip = parse_ip(host)
            reason = always_denied_reason(ip) if ip is not None else None
            if len(known) >= _KNOWN_ADDRESSES_MAX:
                known.clear()
            known[host] = reason
        if reason is not None:
            raise EgressDenied(host, port, f"{reason} (always denied, with or without a policy)")
        return socket.socket(family=family, type=type_, proto=proto)

    return factory


def make_session(
    policy: Policy | EgressMatcher,
    *,
    pins: PinStore | None = None,
    resolver: AbstractResolver | None = None,
    connector_kwargs: dict[str, Any] | None = None,
    **kwargs: Any,
) -> aiohttp.ClientSession:
    """Return a policy-checked ``ClientSession``: pinning connector, no proxies, no redirects.

    Must be called with a running event loop (as any ``ClientSession``).

    Args:
        policy: the policy (or a prepared matcher).
        pins: pin store to share with the process guard.
        resolver: underlying resolver for hostname destinations.
        connector_kwargs: passed to :func:`make_connector`.
        **kwargs: passed to ``aiohttp.ClientSession`` (``timeout``, ``headers``, ...);
            ``trust_env``, ``connector`` and ``middlewares`` are fixed.

    Raises:
        ValueError: ``trust_env``, ``connector`` or ``middlewares`` was given.
    """
    for fixed in ("trust_env", "connector", "middlewares"):
        if fixed in kwargs:
            raise ValueError(f"{fixed} is fixed by the policy transport")
    matcher = _matcher(policy, pins)
    return aiohttp.ClientSession(
        connector=make_connector(matcher, resolver=resolver, **(connector_kwargs or {})),
        trust_env=False,
        middlewares=(policy_middleware(matcher),),
        **kwargs,
    )
