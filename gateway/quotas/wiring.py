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
        ConfigError: the managed key store cannot be opened (the sections themselves are
            validated by ``gateway.settings.load``).
    """

    def build(settings: Any, **kwargs: Any) -> Any:
        observers = list(kwargs.pop("observers", ()))
        admission = list(kwargs.pop("admission", ()))
        hook = quota_hook(getattr(settings, "quotas", None), on_event=_audit_sink(observers))
        if hook is not None:
            observers.append(hook)
            admission.append(hook)
        if kwargs.get("authenticator") is None:
            try:
                kwargs["authenticator"] = managed_authenticator(settings)
            except KeystoreError as exc:
                raise ConfigError(f"keystore: {exc.message}") from exc
        app = factory(settings, observers=observers, admission=admission, **kwargs)
        return app if hook is None else hook.asgi(app)

    return build
