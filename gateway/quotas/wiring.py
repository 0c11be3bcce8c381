"""The quota and managed-key components of the gateway, built from its settings.

:func:`gateway.assembly.assemble` calls :func:`build_quota_hook` (the
:class:`~gateway.quotas.hook.QuotaHook`, an admission hook and observer; backend outages go to
the audit log's ``record_event`` when the audit log is on) and :func:`build_authenticator` (the
config keys, plus the managed keys of ``keystore:`` when enabled). Nothing is opened here: the
Redis client and the key store connect in the app's lifespan.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gateway.auth import Authenticator, KeyRing
from gateway.errors import ConfigError
from gateway.keystore.auth import managed_authenticator
from gateway.keystore.errors import KeystoreError
from gateway.keystore.settings import KeystoreSettings
from gateway.quotas.hook import QuotaHook, quota_hook
from gateway.quotas.limiter import EventSink
from gateway.settings import GatewaySettings

__all__ = ["build_authenticator", "build_quota_hook"]


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else str(err["msg"])


def _section(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    return dict(value) if isinstance(value, dict) else dict(value.model_dump())


def build_quota_hook(
    settings: GatewaySettings, on_event: EventSink | None = None
) -> QuotaHook | None:
    """The quota hook of ``settings.quotas`` (``None`` when absent or disabled).

    Args:
        settings: The gateway settings.
        on_event: Sink for quota backend outage and recovery events (the audit log).

    Raises:
        ConfigError: Invalid ``quotas:`` section, naming the key (e.g. ``quotas: defaults.key.
            requests_per_minute: Input should be greater than or equal to 1``).
    """
    try:
        return quota_hook(settings.quotas, on_event=on_event)
    except ValidationError as exc:
        raise ConfigError(f"quotas: {_first_error(exc)}") from exc


def build_authenticator(settings: GatewaySettings) -> Authenticator:
    """The key lookup: config-file keys, then the managed keys of ``keystore:`` if enabled.

    Raises:
        ConfigError: Invalid ``keystore:`` section (naming the key), or managed keys enabled
            without any store (neither ``keystore.store`` nor ``audit.store``).
    """
    keystore = _section(settings.keystore)
    try:
        if keystore is not None:
            ks = KeystoreSettings.model_validate(keystore)
            if ks.enabled and not ks.store and not (_section(settings.audit) or {}).get("store"):
                raise ConfigError("keystore: store is not set and there is no audit.store")
        managed = managed_authenticator(settings)
    except ValidationError as exc:
        raise ConfigError(f"keystore: {_first_error(exc)}") from exc
    except KeystoreError as exc:
        raise ConfigError(f"keystore: {exc.message}") from exc
    return managed if managed is not None else KeyRing(settings.keys)
