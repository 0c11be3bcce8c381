"""Opt-in JWKS refresh from an issuer's ``jwks_uri``, through the egress policy.

A :class:`JwksFetcher` fetches one issuer's JWKS at start and then every ``jwks_refresh_s``
seconds, never more often and never because a token names a ``kid`` it does not know (an
attacker minting tokens with random ``kid`` values cannot make the gateway call out). The HTTP
client is the egress policy's (``policy.make_httpx_client``): the host must be a destination of
the policy, redirects are refused, nothing bypasses the policy (DNS included). A response that
is not a valid JWKS (status, size over 1 MiB, not JSON, a private key, ...) is refused whole
and the keys fetched before stay. The pinned file's keys are always used too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import httpx

from gateway.errors import ConfigError
from gateway.identity.jwks import MAX_JWKS_BYTES, KeySet, parse_jwks
from policy import PolicyError

__all__ = ["JwksFetcher"]

_log = logging.getLogger(__name__)


class JwksFetcher:
    """Keeps the fetched key set of one issuer fresh.

    Args:
        issuer: The issuer (for messages).
        uri: Its ``jwks_uri``.
        algorithms: Algorithms its keys may be prepared for.
        refresh_s: Seconds between fetches (the cap).
        client: Builds the egress policy's HTTP client (called once, at start).
        timeout_s: Timeout of one fetch, seconds.
    """

    def __init__(self, issuer: str, uri: str, algorithms: tuple[str, ...], refresh_s: float,
                 client: Callable[[], httpx.AsyncClient], timeout_s: float = 5.0) -> None:
        self.issuer = issuer
        self.uri = uri
        self.algorithms = algorithms
        self.refresh_s = refresh_s
        self.keyset: KeySet | None = None
        self.fetches = 0
        self.last_error: str | None = None
        self._client_factory = client
        self._client: httpx.AsyncClient | None = None
        self._timeout_s = timeout_s
        self._task: asyncio.Task[None] | None = None

    def same_as(self, uri: str, algorithms: tuple[str, ...], refresh_s: float) -> bool:
        """True when a reloaded configuration asks for the same fetch (then it is kept)."""
        return (uri, algorithms, refresh_s) == (self.uri, self.algorithms, self.refresh_s)

    async def start(self) -> None:
        """Fetch once (a failure is logged, not raised: the pinned keys still work), then keep
        refreshing in the background."""
        if self._task is not None:
            return
        self._client = self._client_factory()
        await self.refresh()
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        """Stop refreshing and close the client."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()

    async def refresh(self) -> bool:
        """Fetch and parse the JWKS once; keep the previous keys on any failure.

        Returns:
            Whether new keys are in use.
        """
        assert self._client is not None, "start() first"
        self.fetches += 1
        try:
            data = await self._get()
            keyset = parse_jwks(data, self.algorithms, f"jwks_uri {self.uri}")
        except (httpx.HTTPError, PolicyError, ConfigError, OSError, ValueError) as exc:
            # PolicyError: the host is not a destination of the egress policy (nothing sent)
            self.last_error = str(exc)
            _log.warning("JWKS of %s from %s refused, keeping the keys in use: %s",
                         self.issuer, self.uri, exc)
            return False
        self.last_error = None
        if self.keyset is None or keyset.sha256 != self.keyset.sha256:
            _log.info("JWKS of %s from %s: %d keys, sha256 %s", self.issuer, self.uri,
                      len(keyset.kids), keyset.sha256)
        self.keyset = keyset
        return True

    async def _get(self) -> bytes:
        assert self._client is not None
        async with self._client.stream("GET", self.uri, timeout=self._timeout_s,
                                       headers={"accept": "application/json"}) as response:
            if response.status_code != 200:
                raise ValueError(f"HTTP {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise ValueError(f"larger than {MAX_JWKS_BYTES} bytes")
            return bytes(body)

    def status(self) -> dict[str, Any]:
        """What the fetcher holds (for logs and explain)."""
        return {"uri": self.uri, "fetches": self.fetches, "last_error": self.last_error,
                "jwks_sha256": self.keyset.sha256 if self.keyset else None}
