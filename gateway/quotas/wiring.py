"""The quota and managed-key components of the gateway, built from its settings.

:func:`gateway.assembly.assemble` calls :func:`build_quota_hook` (the
:class:`~gateway.quotas.hook.QuotaHook`, an admission hook and observer; backend outages go to
the audit log's ``record_event`` when the audit log is on) and :func:`build_authenticator` (the
config keys, plus the managed keys of ``keystore:`` when enabled). Nothing is opened here: the
Redis client and the key store connect in the app's lifespan.
"""

from __future__ import annotations

from gateway.auth import Authenticator, KeyRing
from gateway.config.settings import GatewaySettings
from gateway.errors import ConfigError
from gateway.keystore.auth import managed_authenticator
from gateway.keystore.errors import KeystoreError
from gateway.quotas.hook import QuotaHook, quota_hook
from gateway.quotas.limiter import EventSink

__all__ = ["build_authenticator", "build_quota_hook"]


def build_quota_hook(
    settings: GatewaySettings, on_event: EventSink | None = None
) -> QuotaHook | None:
    """The quota hook of ``settings.quotas`` (``None`` when absent or disabled).

    Args:
        settings: The gateway settings.
        on_event: Sink for quota backend outage and recovery events (the audit log).

    The section itself is validated by :func:`gateway.config.loader.load`.
    """
    return quota_hook(settings.quotas, on_event=on_event)


def build_authenticator(settings: GatewaySettings) -> Authenticator:
    """The key lookup: config-file keys, then the managed keys of ``keystore:`` if enabled.

    The ``keystore:`` section (and that it has a store, its own or the audit log's) is
    validated by :func:`gateway.config.loader.load`.

    Raises:
        ConfigError: The key store URL is not supported.
    """
    try:
        managed = managed_authenticator(settings)
    except KeystoreError as exc:
        raise ConfigError(f"keystore: {exc.message}") from exc
    return managed if managed is not None else KeyRing(settings.keys)
