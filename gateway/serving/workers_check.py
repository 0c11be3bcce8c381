"""What ``gateway serve --workers N`` refuses before anything is bound: a configuration one
worker would refuse (:func:`check_assembly`), and settings whose state would diverge between
the N processes (:func:`check_workers`: quotas in memory, an in-memory SQLite store, a flow
control threshold below N). ``gateway check-config --workers N`` runs the same checks.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.config.errors import InvalidConfig
from gateway.config.settings import GatewaySettings
from gateway.errors import ConfigError

__all__ = ["check_assembly", "check_workers"]


def _memory_sqlite(url: str | None) -> bool:
    return url is not None and url.startswith("sqlite:") and (
        ":memory:" in url or "mode=memory" in url)


def check_workers(settings: GatewaySettings, workers: int) -> None:
    """Refuse settings whose state would diverge between ``workers`` processes.

    Args:
        settings: The loaded settings.
        workers: Worker processes (1: nothing to check).

    Raises:
        InvalidConfig: ``file:line: key: problem`` for each setting that keeps pod-wide state
            in one process's memory, and each flow-control ``in_flight`` threshold smaller than
            ``workers`` (each worker enforces its share of it: see
            :meth:`gateway.flow.settings.FlowControlSettings.limits`).
    """
    if workers <= 1:
        return
    problems: list[str] = []
    q = settings.quotas
    if q is not None and q.enabled and q.backend == "memory":
        problems.append(
            f"quotas.backend: memory keeps quota state inside one process; with --workers "
            f"{workers} each worker would admit the whole limit: use backend: redis (shared), "
            "or --workers 1")
    if settings.audit is not None and settings.audit.enabled and _memory_sqlite(
            settings.audit.store):
        problems.append("audit.store: an in-memory SQLite store is per process; with --workers "
                        f"{workers} use a file or PostgreSQL")
    ks = settings.keystore
    if ks is not None and ks.enabled and _memory_sqlite(ks.store):
        problems.append("keystore.store: an in-memory SQLite store is per process: a key "
                        f"created or revoked would reach one of {workers} workers; use a file "
                        "or PostgreSQL")
    fc = settings.flow_control
    if fc.enabled:
        for where, value in fc.small_in_flight(workers):
            problems.append(
                f"flow_control.{where}: {value} is less than --workers {workers}: each worker "
                f"enforces its share of an in_flight threshold ({value} // {workers} = "
                f"{value // workers} for some); set at least {workers}, or fewer workers")
    if problems:
        located = [p for msg in problems for p in settings.problems_of(ConfigError(msg))]
        raise InvalidConfig(located)


def check_assembly(settings: GatewaySettings, base: Path | None) -> None:
    """Refuse a configuration that a worker would refuse, before any socket is bound.

    The assembly ``gateway check-config`` runs (without the process guard, which each worker
    installs and self-tests): the policy and each replica's destination, key store, telemetry,
    TLS files, audit key files, quotas. No store is opened and nothing is served; the
    telemetry's exporters it built are shut down again.

    Args:
        settings: The loaded settings.
        base: Directory of the config file (relative paths).

    Raises:
        ConfigError: The policy file is unreadable or invalid, or a replica is outside its
            destination (raised as one ``gateway serve`` raises it, before its assembly).
        InvalidConfig: ``file:line: key: problem`` for the first invalid section (as a single
            ``gateway serve`` reports it).
    """
    from gateway.assembly import assemble
    from gateway.egress import load_policy

    load_policy(settings, base)  # what one process's start_egress raises, unlocated as there
    try:
        gateway = assemble(settings, base)
    except ConfigError as exc:
        raise InvalidConfig(settings.problems_of(exc)) from exc
    if gateway.telemetry is not None:
        asyncio.run(gateway.telemetry.shutdown())  # its span exporter thread; nothing started
