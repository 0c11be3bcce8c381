"""Wiring of quotas and managed keys into the gateway app factory.

:func:`with_limits` wraps ``gateway.app.create_app`` so that the app gets

* the :class:`~gateway.quotas.hook.QuotaHook` of ``settings.quotas`` (admission hook and
  observer), with quota backend outages sent to the audit log when an audit observer is among
  the ``observers`` (as ``gateway.audit.observer.audited_app`` passes it);
* the managed key authenticator of ``settings.keystore`` (config keys first);
* ``x-ratelimit-*`` headers on successful relayed responses (:meth:`QuotaHook.asgi`).

Usage (``gateway serve``)::

    app = audited_app(settings, with_limits(create_app))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from gateway.errors import ConfigError
from gateway.keystore.auth import managed_authenticator
from gateway.keystore.errors import KeystoreError
from gateway.quotas.hook import quota_hook
from gateway.quotas.limiter import EventSink


def _audit_sink(observers: list[Any]) -> EventSink | None:
    try:
        from gateway.audit.observer import AuditObserver
    except ImportError:  # pragma: no cover - audit is part of the gateway
        return None
    for observer in observers:
        if isinstance(observer, AuditObserver):
            sink: EventSink = observer.log.append
            return sink
    return None


def with_limits(factory: Callable[..., Any]) -> Callable[..., Any]:
    """Return ``factory`` with quotas and managed keys of the settings wired in.

    Args:
        factory: ``gateway.app.create_app`` (or a wrapper with its signature).

    Returns:
        A factory ``(settings, **kwargs) -> app``; explicit ``authenticator`` / ``admission`` /
        ``observers`` kwargs are kept (quota hooks are appended).

    Raises:
        ConfigError: invalid ``quotas:`` or ``keystore:`` section (the message names the key),
            or managed keys enabled without any store.
    """

    def build(settings: Any, **kwargs: Any) -> Any:
        observers = list(kwargs.pop("observers", ()))
        admission = list(kwargs.pop("admission", ()))
        try:
            hook = quota_hook(getattr(settings, "quotas", None), on_event=_audit_sink(observers))
        except ValidationError as exc:
            raise ConfigError(f"quotas: {_first_error(exc)}") from exc
        if hook is not None:
            observers.append(hook)
            admission.append(hook)
        if kwargs.get("authenticator") is None:
            try:
                kwargs["authenticator"] = managed_authenticator(settings)
            except ValidationError as exc:
                raise ConfigError(f"keystore: {_first_error(exc)}") from exc
            except KeystoreError as exc:
                raise ConfigError(f"keystore: {exc.message}") from exc
        app = factory(settings, observers=observers, admission=admission, **kwargs)
        return app if hook is None else hook.asgi(app)

    return build


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else str(err["msg"])


def validate_limits(settings: Any) -> None:
    """Validate the ``quotas:`` and ``keystore:`` sections without starting anything.

    Raises:
        ConfigError: the first problem, naming the key (e.g. ``quotas: defaults.key.
            requests_per_minute: Input should be greater than or equal to 1``).
    """
    from gateway.keystore.settings import KeystoreSettings
    from gateway.quotas.settings import QuotaSettings

    for name, model in (("quotas", QuotaSettings), ("keystore", KeystoreSettings)):
        section = getattr(settings, name, None)
        if section is None:
            continue
        try:
            model.model_validate(section)
        except ValidationError as exc:
            raise ConfigError(f"{name}: {_first_error(exc)}") from exc
    keystore = getattr(settings, "keystore", None)
    if keystore is not None and keystore.get("enabled", True) and not keystore.get("store"):
        if not (getattr(settings, "audit", None) or {}).get("store"):
            raise ConfigError("keystore: store is not set and there is no audit.store")
