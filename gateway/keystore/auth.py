"""Managed keys as a gateway :class:`~gateway.auth.Authenticator`.

``ManagedKeyAuthenticator`` first asks the config-file keys (``KeyRing``, constant time), then
the managed key cache. Both failures give the same :class:`AuthenticationFailed`; a stale cache
gives :class:`ServiceUnavailable` (503, code ``keystore_unavailable``). The cache is started and
stopped through ``startup()`` / ``shutdown()``, which the app lifespan calls on hooks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.auth import Authenticator, KeyRing, Principal
from gateway.errors import AuthenticationFailed, ServiceUnavailable
from gateway.keystore.backends import open_keystore
from gateway.keystore.cache import ManagedKeyCache
from gateway.keystore.errors import KeystoreConfigError, KeystoreUnavailable
from gateway.keystore.settings import KeystoreSettings


class ManagedKeyAuthenticator:
    """Config keys first, then managed keys.

    Args:
        config_keys: the authenticator of the config file's keys (or None).
        cache: the managed key cache.
    """

    def __init__(self, config_keys: Authenticator | None, cache: ManagedKeyCache) -> None:
        self._config = config_keys
        self.cache = cache

    async def startup(self) -> None:
        """Load the managed keys and start polling (raises if the store is unreachable)."""
        await self.cache.start()

    async def shutdown(self) -> None:
        """Stop polling."""
        await self.cache.stop()

    def authenticate(self, token: str | None, scope: Mapping[str, Any] | None = None) -> Principal:
        """Return the principal of ``token`` (``scope`` is not used).

        Raises:
            AuthenticationFailed: unknown, revoked, expired or rotated-out key.
            ServiceUnavailable: the managed key view is stale (code ``keystore_unavailable``).
        """
        if self._config is not None:
            try:
                return self._config.authenticate(token)
            except AuthenticationFailed:
                pass
        if token is None:
            raise AuthenticationFailed("missing_credential")
        try:
            key = self.cache.lookup(token)
        except KeystoreUnavailable as exc:
            raise ServiceUnavailable(
                "Managed keys are temporarily unavailable; retry shortly.",
                code="keystore_unavailable",
                headers={"retry-after": "2"},
            ) from exc
        if key is None:
            raise AuthenticationFailed()
        return Principal(key.id, key.team, key.data_class, frozenset(key.models))


def _raw(section: Any) -> dict[str, Any] | None:
    if section is None:
        return None
    if isinstance(section, Mapping):
        return dict(section)
    return dict(section.model_dump())


def managed_authenticator(settings: Any) -> ManagedKeyAuthenticator | None:
    """The authenticator for ``settings.keystore`` (config keys first), or None.

    Managed keys are on when the gateway config has an enabled ``keystore:`` section; its
    ``store`` defaults to the ``audit:`` store, so keys live in the audit database.

    Args:
        settings: the ``GatewaySettings``.

    Raises:
        pydantic.ValidationError: invalid ``keystore:`` section.
        KeystoreConfigError: no store configured anywhere, or an unsupported URL.
    """
    section = getattr(settings, "keystore", None)
    if section is None:
        return None
    ks = section if isinstance(section, KeystoreSettings) else (
        KeystoreSettings.model_validate(_raw(section)))
    if not ks.enabled:
        return None
    audit = _raw(getattr(settings, "audit", None)) or {}
    url = ks.store or audit.get("store")
    if not url:
        raise KeystoreConfigError("keystore.store is not set and there is no audit.store")
    cache = ManagedKeyCache(
        open_keystore(str(url)), refresh_s=ks.refresh_s, max_stale_s=ks.max_stale_s
    )
    return ManagedKeyAuthenticator(KeyRing(settings.keys), cache)
