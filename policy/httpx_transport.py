"""Policy-checked outbound HTTP for httpx (and so for the ``openai`` SDK and litellm clients).

:class:`PolicyAsyncTransport` does for httpx what :mod:`policy.transport` does for aiohttp:
a host no destination names is refused without a DNS query; a hostname destination is resolved
once, every address checked and pinned (shared :class:`~policy.egress.PinStore`); the request
is sent to the checked address with the original ``Host`` header and TLS SNI / certificate name
(httpcore's ``sni_hostname`` extension). The check is :func:`~policy.egress.check_target`, the
one shared with the aiohttp transport. Each hostname gets its own connection pool, so a TLS
connection verified for one name is never reused for another name on the same address.

:func:`make_httpx_client` wraps it in an ``httpx.AsyncClient`` that never follows redirects
(a 3xx raises :class:`~policy.errors.RedirectRefused`) and ignores proxy variables
(``trust_env=False``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from .addresses import always_denied_reason, parse_ip
from .egress import EgressMatcher, PinStore, SyncResolver, check_target, system_resolve
from .errors import EgressDenied, RedirectRefused
from .evaluate import Policy

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_DEFAULT_PORTS = {"http": 80, "https": 443}


class PolicyAsyncTransport(httpx.AsyncBaseTransport):
    """An httpx transport that connects only to checked, pinned addresses.

    Args:
        policy: the policy or a prepared matcher (share ``guard.matcher`` with the guard).
        pins: pin store to share (ignored when a matcher is given).
        resolver: resolves hostname destinations, ``(host, port) -> [address, ...]`` (default:
            system getaddrinfo, run in a worker thread).
        **transport_kwargs: passed to each ``httpx.AsyncHTTPTransport`` (``verify``, ``limits``,
            ``http2``, ...); ``trust_env`` and ``proxy`` are fixed off.
    """

    def __init__(
        self,
        policy: Policy | EgressMatcher,
        *,
        pins: PinStore | None = None,
        resolver: SyncResolver = system_resolve,
        **transport_kwargs: Any,
    ) -> None:
        if "proxy" in transport_kwargs or "trust_env" in transport_kwargs:
            raise ValueError("proxy and trust_env are fixed by the policy transport")
        self.matcher = policy if isinstance(policy, EgressMatcher) else EgressMatcher(policy, pins)
        self._resolver = resolver
        self._kwargs = transport_kwargs
        self._pools: dict[str, httpx.AsyncHTTPTransport] = {}

    def _pool(self, key: str) -> httpx.AsyncHTTPTransport:
        pool = self._pools.get(key)
        if pool is None:
            pool = httpx.AsyncHTTPTransport(trust_env=False, **self._kwargs)
            self._pools[key] = pool
        return pool

    async def _resolve(self, host: str, port: int) -> list[str]:
        return await asyncio.to_thread(self._resolver, host, port)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Check, pin and send one request.

        Raises:
            EgressDenied: the host or a resolved address is not allowed.
        """
        url = request.url
        port = url.port or _DEFAULT_PORTS.get(url.scheme, 0)
        target = await check_target(self.matcher, url.host, port, self._resolve)
        ip, hostname = target.addresses[0], target.hostname
        if hostname is not None:
            request.url = url.copy_with(host=str(ip))
            if url.scheme == "https":
                request.extensions = {**request.extensions, "sni_hostname": hostname}
        return await self._pool(hostname or str(ip)).handle_async_request(request)

    async def aclose(self) -> None:
        """Close every connection pool."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()


class DeniedAddressAsyncTransport(httpx.AsyncBaseTransport):
    """An httpx transport for clients with no policy: the always-denied addresses (link-local
    / cloud metadata, this host, broadcast, multicast; :func:`~policy.addresses.
    always_denied_reason`) are refused after resolution, and the request goes to the checked
    address (original ``Host`` header, TLS SNI / certificate name), so a second DNS answer
    cannot move it. The httpx twin of :func:`~policy.transport.denied_address_socket_factory`.

    Args:
        resolver: ``(host, port) -> [address, ...]`` (default: system getaddrinfo in a thread).
    """

    def __init__(self, resolver: SyncResolver = system_resolve) -> None:
        self._resolver = resolver
        self._pools: dict[str, httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Resolve, check every address, send to the first.

        Raises:
            EgressDenied: an address of the host is always denied.
        """
        url = request.url
        port = url.port or _DEFAULT_PORTS.get(url.scheme, 0)
        literal = parse_ip(url.host)
        addresses = [str(literal)] if literal is not None else \
            await asyncio.to_thread(self._resolver, url.host, port)
        for address in addresses:
            ip = parse_ip(address)
            reason = always_denied_reason(ip) if ip is not None else None
            if reason is not None:
                raise EgressDenied(url.host, port, f"{reason} (always denied, with or "
                                   f"without a policy; resolved to {address})")
        if not addresses:
            raise EgressDenied(url.host, port, "the name has no address")
        if literal is None:
            request.url = url.copy_with(host=addresses[0])
            if url.scheme == "https":
                request.extensions = {**request.extensions, "sni_hostname": url.host}
        key = url.host
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = httpx.AsyncHTTPTransport(trust_env=False)
        return await pool.handle_async_request(request)

    async def aclose(self) -> None:
        """Close every connection pool."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()


async def _refuse_redirect(response: httpx.Response) -> None:
    if response.status_code in _REDIRECTS:
        location = response.headers.get("location", "")
        await response.aclose()
        raise RedirectRefused(
            response.request.url.host, response.request.url.port,
            f"upstream answered {response.status_code} redirect to {location!r}; "
            "policy-checked clients never follow redirects",
        )


def make_httpx_client(
    policy: Policy | EgressMatcher,
    *,
    pins: PinStore | None = None,
    resolver: SyncResolver = system_resolve,
    transport_kwargs: dict[str, Any] | None = None,
    **client_kwargs: Any,
) -> httpx.AsyncClient:
    """Return an ``httpx.AsyncClient`` over :class:`PolicyAsyncTransport`: no redirects, no proxies.

    Use it as the ``http_client`` of ``openai.AsyncOpenAI`` (and so of litellm's OpenAI-
    compatible provider via ``client=``).

    Raises:
        ValueError: ``transport``, ``mounts``, ``proxy``, ``trust_env`` or ``follow_redirects``
            was given.
    """
    for fixed in ("transport", "mounts", "proxy", "trust_env", "follow_redirects"):
        if fixed in client_kwargs:
            raise ValueError(f"{fixed} is fixed by the policy transport")
    hooks = dict(client_kwargs.pop("event_hooks", None) or {})
    hooks["response"] = [*hooks.get("response", []), _refuse_redirect]
    return httpx.AsyncClient(
        transport=PolicyAsyncTransport(policy, pins=pins, resolver=resolver,
                                       **(transport_kwargs or {})),
        follow_redirects=False,
        trust_env=False,
        event_hooks=hooks,
        **client_kwargs,
    )
