"""Opt-in JWKS refresh from an issuer's ``jwks_uri``, through the egress policy.

A :class:`JwksFetcher` fetches one issuer's JWKS at start and then every ``jwks_refresh_s``
seconds, never more often and never because a token names a ``kid`` it does not know (an
attacker minting tokens with random ``kid`` values cannot make the gateway call out). The HTTP
client is the egress policy's (``policy.make_httpx_client``): the host must be a destination of
the policy, redirects are refused, nothing bypasses the policy (DNS included). A response that
is not a valid JWKS (status, size over 1 MiB, not JSON, a private key, a key PyJWT cannot
build, ...) is refused whole and the keys fetched before stay. The pinned file's keys are
always used too.

The refresh loop never ends on a failure: each one is logged (a warning naming the issuer, the
URI and the problem), counted (:attr:`JwksFetcher.outcomes`, the
``sg.gateway.identity.jwks_fetches`` counter) and followed by the next try, after
``jwks_refresh_s`` doubled per failure in a row, up to :data:`BACKOFF_CAP_S` (or
``jwks_refresh_s`` when that is longer); a success goes back to ``jwks_refresh_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx

from gateway.errors import ConfigError
from gateway.identity.jwks import MAX_JWKS_BYTES, KeySet, parse_jwks
from policy import PolicyError

__all__ = ["BACKOFF_CAP_S", "JwksFetcher"]

_log = logging.getLogger(__name__)

BACKOFF_CAP_S = 300.0
"""Longest wait between two fetches after failures in a row, seconds (unless
``jwks_refresh_s`` is longer: a fetch never comes sooner than that)."""


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
        self.failures_in_a_row = 0
        self.outcomes: Counter[str] = Counter()
        """``ok`` / ``refused`` (the document or the fetch failed) / ``error`` (a bug caught
        by the loop) -> count."""
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
        await self._refresh_guarded()
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

    def next_wait_s(self) -> float:
        """Seconds until the next fetch: ``refresh_s`` after a success, doubled per failure in
        a row up to ``max(refresh_s, BACKOFF_CAP_S)``."""
        if self.failures_in_a_row == 0:
            return self.refresh_s
        backoff = self.refresh_s * 2.0 ** min(self.failures_in_a_row - 1, 16)
        return min(backoff, max(self.refresh_s, BACKOFF_CAP_S))

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.next_wait_s())
            await self._refresh_guarded()

    async def _refresh_guarded(self) -> None:
        try:
            await self.refresh()
        except Exception as exc:  # the fetcher outlives any one fetch
            # refresh() maps every expected failure; this is a bug, and still must neither
            # stop start-up nor end the refreshes (withdrawn keys would stay in use for ever).
            self.failures_in_a_row += 1
            self.outcomes["error"] += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            _log.exception("JWKS refresh of %s from %s failed, keeping the keys in use",
                           self.issuer, self.uri)

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
            self.failures_in_a_row += 1
            self.outcomes["refused"] += 1
            _log.warning("JWKS of %s from %s refused, keeping the keys in use (next try in "
                         "%.0f s): %s", self.issuer, self.uri, self.next_wait_s(), exc)
            return False
        self.last_error = None
        self.failures_in_a_row = 0
        self.outcomes["ok"] += 1
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
                "jwks_sha256": self.keyset.sha256 if self.keyset else None,
                "failures_in_a_row": self.failures_in_a_row, "outcomes": dict(self.outcomes)}

    def outcome_rows(self) -> list[tuple[tuple[str, ...], float]]:
        """``((issuer, outcome), count)`` rows (the ``jwks_fetches`` counter)."""
        return [((self.issuer, outcome), float(n)) for outcome, n in list(self.outcomes.items())]
