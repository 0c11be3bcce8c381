"""ManagedKeyCache: the replica-local view of the managed keys, used on the request path.

Lookups never do I/O: a background task polls the store's revision every ``refresh_s``
seconds and reloads the keys when it changed, so a revocation made on any replica (or by the
CLI) takes effect everywhere within ``refresh_s`` plus one query. Expiry and the end of a
rotation grace period are checked against the clock at lookup time (exact, no refresh needed).

If the store cannot be read for longer than ``max_stale_s``, lookups raise
:class:`KeystoreUnavailable` (the gateway answers 503) rather than trusting a view that might
miss a revocation.

A presented key is found by the SHA-256 of the key in a dict. Timing can at most reveal
something about hash-table buckets of SHA-256 digests, which an attacker cannot steer toward a
stored digest without a preimage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from gateway.keystore.errors import KeystoreError, KeystoreUnavailable
from gateway.keystore.models import KeySecret, ManagedKey, digest_hex
from gateway.keystore.store import KeyStore

_log = logging.getLogger(__name__)


class ManagedKeyCache:
    """Polls a key store and answers lookups from memory.

    Args:
        store: the key store.
        refresh_s: poll period, in seconds.
        max_stale_s: refuse lookups when the last successful poll is older than this.
        clock: wall clock (Unix seconds) for expiry checks.
        monotonic: monotonic clock for staleness.
    """

    def __init__(
        self,
        store: KeyStore,
        *,
        refresh_s: float = 2.0,
        max_stale_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self.max_stale_s = max_stale_s
        self._clock = clock
        self._monotonic = monotonic
        self._revision = -1
        self._index: dict[str, tuple[KeySecret, ManagedKey]] = {}
        self._keys: dict[str, ManagedKey] = {}
        self._fresh_at = float("-inf")
        self._task: asyncio.Task[None] | None = None

    @property
    def revision(self) -> int:
        """The store revision this view reflects (-1 before the first load)."""
        return self._revision

    async def start(self) -> None:
        """Create the tables if needed, load once (raising if the store is down), then poll."""
        await self.store.init()
        await self.refresh()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="keystore-refresh")

    async def stop(self) -> None:
        """Stop polling and close the store."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.store.close()

    async def refresh(self) -> bool:
        """Poll once; reload when the revision changed.

        Returns:
            True when the view changed.

        Raises:
            KeystoreError: the store could not be read (the previous view is kept).
        """
        revision = await self.store.revision()
        if revision == self._revision:
            self._fresh_at = self._monotonic()
            return False
        revision, keys = await self.store.load()
        index: dict[str, tuple[KeySecret, ManagedKey]] = {}
        for key in keys:
            for secret in key.secrets:
                index[secret.digest] = (secret, key)
        self._index = index
        self._keys = {k.id: k for k in keys}
        self._revision = revision
        self._fresh_at = self._monotonic()
        return True

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except KeystoreError as exc:
                _log.warning("managed key refresh failed: %s", exc)
            except Exception:
                _log.exception("managed key refresh failed")

    def lookup(self, token: str) -> ManagedKey | None:
        """Return the usable key this token belongs to, or None.

        Raises:
            KeystoreUnavailable: the view is older than ``max_stale_s``.
        """
        if self._monotonic() - self._fresh_at > self.max_stale_s:
            raise KeystoreUnavailable(
                "managed keys could not be refreshed from the key store recently"
            )
        found = self._index.get(digest_hex(token))
        if found is None:
            return None
        secret, key = found
        now_ms = int(self._clock() * 1000)
        if not key.usable_at(now_ms) or not secret.valid_at(now_ms):
            return None
        return key

    def get(self, key_id: str) -> ManagedKey | None:
        """Return a key by id from the current view (any state), or None."""
        return self._keys.get(key_id)
