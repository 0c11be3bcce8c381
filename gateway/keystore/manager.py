"""KeyManager: the admin actions on managed keys (create, list, revoke, rotate).

Every action that changes a key is first appended to the audit log (``key.created``,
``key.rotated``, ``key.revoked``) and applied only once that record is durable, so no change
goes unaudited; if applying then fails, a ``key.action_failed`` record follows (best effort).
Audit records hold ids, teams, models and times, never a key or its digest.

Keys are ``sg-`` + ``secrets.token_urlsafe(32)`` (256 bits); only their SHA-256 is stored and
the key is returned once, to be shown to the operator once.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.keystore.errors import (
    KeyNotFound,
    KeyStateError,
    KeystoreConfigError,
    KeystoreError,
)
from gateway.keystore.models import KEY_ID_RE, KeySecret, ManagedKey, digest_hex
from gateway.keystore.store import KeyStore

_log = logging.getLogger(__name__)

KEY_PREFIX = "sg-"
EventSink = Callable[[Mapping[str, Any]], Awaitable[Any]]


@dataclass(frozen=True)
class IssuedKey:
    """A key as issued: the record and the plaintext key (shown once, never stored)."""

    key: ManagedKey
    token: str


def new_token() -> str:
    """Return a fresh random key: ``sg-`` + 43 URL-safe characters (256 bits of entropy)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeyManager:
    """Admin actions on a key store.

    Args:
        store: the key store (``init`` is called on first use).
        audit: receives one event per action (the audit log's ``append``); None only when the
            operator explicitly runs without audit.
        actor: who performs the actions (recorded in the audit events).
        clock: wall clock, Unix seconds.
    """

    def __init__(
        self,
        store: KeyStore,
        *,
        audit: EventSink | None,
        actor: str = "unknown",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self._audit = audit
        self._actor = actor
        self._clock = clock
        self._ready = False

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def _init(self) -> None:
        if not self._ready:
            await self.store.init()
            self._ready = True

    async def create(
        self,
        *,
        team: str | None,
        models: Sequence[str],
        key_id: str | None = None,
        expires_in_s: float | None = None,
        data_class: str = "internal",
        description: str = "",
    ) -> IssuedKey:
        """Create a key.

        Args:
            team: team of the key (team quotas apply), or None.
            models: model names it may use (``*``: all); at least one.
            key_id: stable id; default ``key-`` + 12 random hex digits.
            expires_in_s: lifetime in seconds, or None for no expiry.
            data_class: data classification (egress policy).
            description: free text.

        Returns:
            The record and the key (print it once).

        Raises:
            KeystoreConfigError: invalid id, models or lifetime.
            KeyExists: the id is taken.
            KeystoreUnavailable / audit errors: nothing was created.
        """
        await self._init()
        kid = key_id or f"key-{secrets.token_hex(6)}"
        if not KEY_ID_RE.match(kid):
            raise KeystoreConfigError(f"invalid key id {kid!r}: use [A-Za-z0-9][A-Za-z0-9._-]*")
        if not models or any(not m for m in models):
            raise KeystoreConfigError("a key needs at least one model (or '*')")
        if expires_in_s is not None and expires_in_s <= 0:
            raise KeystoreConfigError("expiry must be in the future")
        now = self._now_ms()
        token = new_token()
        key = ManagedKey(
            id=kid,
            team=team,
            models=tuple(dict.fromkeys(models)),
            data_class=data_class,
            description=description,
            created_at=now,
            expires_at=None if expires_in_s is None else now + int(expires_in_s * 1000),
        )
        secret = KeySecret(digest_hex(token), kid, now)
        await self._record(
            {
                "type": "key.created",
                "key_id": kid,
                "team": team,
                "models": list(key.models),
                "data_class": data_class,
                "expires_at_ms": key.expires_at,
            }
        )
        await self._apply("create", kid, self.store.insert(key, secret))
        return IssuedKey(dataclasses.replace(key, secrets=(secret,)), token)

    async def list(self) -> list[ManagedKey]:
        """Return every managed key (oldest first), including revoked and expired ones."""
        await self._init()
        return (await self.store.load())[1]

    async def get(self, key_id: str) -> ManagedKey:
        """Return one key. Raises ``KeyNotFound``."""
        await self._init()
        return await self.store.get(key_id)

    async def revoke(self, key_id: str) -> ManagedKey:
        """Revoke a key: every replica refuses it within its ``refresh_s``.

        Raises:
            KeyNotFound: no such key (nothing audited).
            KeyStateError: already revoked (nothing audited).
        """
        await self._init()
        await self.store.get(key_id)  # precise error before anything is audited
        now = self._now_ms()
        await self._record({"type": "key.revoked", "key_id": key_id})
        await self._apply("revoke", key_id, self.store.revoke(key_id, now))
        return await self.store.get(key_id)

    async def rotate(self, key_id: str, *, grace_s: float = 3600.0) -> IssuedKey:
        """Issue a new secret for a key; the old one stays valid for ``grace_s`` seconds.

        The key id (and so its quotas and audit identity) does not change.

        Raises:
            KeyNotFound / KeyStateError: no such key, or revoked / expired.
        """
        await self._init()
        if grace_s < 0:
            raise KeystoreConfigError("grace period must be >= 0 seconds")
        current = await self.store.get(key_id)
        now = self._now_ms()
        if not current.usable_at(now):
            raise KeyStateError(f"managed key {key_id!r} is {current.status(now)}")
        token = new_token()
        grace_until = now + int(grace_s * 1000)
        secret = KeySecret(digest_hex(token), key_id, now)
        await self._record({"type": "key.rotated", "key_id": key_id, "grace_until_ms": grace_until})
        await self._apply("rotate", key_id, self.store.rotate(key_id, secret, grace_until, now))
        return IssuedKey(await self.store.get(key_id), token)

    async def _record(self, event: dict[str, Any]) -> None:
        if self._audit is None:
            return
        await self._audit({**event, "actor": self._actor, "source": "keystore"})

    async def _apply(self, action: str, key_id: str, op: Awaitable[None]) -> None:
        try:
            await op
        except (KeystoreError, KeyNotFound) as exc:
            if self._audit is not None:
                try:
                    await self._audit(
                        {
                            "type": "key.action_failed",
                            "action": action,
                            "key_id": key_id,
                            "error_code": exc.code,
                            "actor": self._actor,
                            "source": "keystore",
                        }
                    )
                except Exception:  # the original error matters more
                    _log.exception("could not audit the failure of %s %s", action, key_id)
            raise
