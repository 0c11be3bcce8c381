"""What a running gateway reports on its admin port (``GET /status``) for ``gateway preflight``.

:func:`gateway_status` returns the status source :meth:`AdminServer.set_status
<gateway.telemetry.admin.AdminServer.set_status>` serves. The document (schema
``sovereign-gateway/status/v1``)::

    {"schema", "config_revision": "sha256:<hex>",
     "policy": {"revision", "source", "unsafe_allow_all"} | null,
     "guard": {"mode": "enforce"|"monitor"|"off", "installed": bool,
               "self_test": "passed"|"not_run"},
     "audit": {"enabled", "store", "state": "ok"|"unavailable", "error", "heartbeat_s",
               "chains", "last_checkpoint": {"chain", "size", "ts_us", "note"} | null},
     "loop": "<module>.<class> of the serving event loop"}      # added by the admin server

``config_revision`` is the digest the audit log's ``config.loaded`` record carries (SHA-256 of
the validated settings' JSON). ``self_test: passed`` means :func:`policy.start_guard` returned a
guard: the gateway refuses to start when the self-test fails. Nothing secret is reported: the
store URL is shown without credentials and the checkpoint note is public by design.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.audit.observer import config_digest

if TYPE_CHECKING:
    from gateway.config.settings import GatewaySettings
    from gateway.egress import EgressRuntime
    from gateway.telemetry.admin import StatusSource
    from policy import Policy

__all__ = ["STATUS_SCHEMA", "audit_state", "gateway_status", "merge_preflight"]

STATUS_SCHEMA = "sovereign-gateway/status/v1"


async def audit_state(section: Any) -> dict[str, Any]:
    """Open the audit store read-only and describe it and its newest checkpoint.

    Args:
        section: The ``audit:`` section (mapping or ``AuditSettings``), or ``None``.

    Returns:
        ``{"enabled": False}`` without an enabled section, else the ``audit`` object of the
        module docstring; a store that cannot be read gives ``state: "unavailable"`` and the
        error (never raises for store problems).
    """
    from gateway.audit import AuditError, AuditSettings, open_store

    if section is None:
        return {"enabled": False}
    settings = section if isinstance(section, AuditSettings) else AuditSettings.model_validate(
        dict(section))
    if not settings.enabled:
        return {"enabled": False}
    out: dict[str, Any] = {"enabled": True, "heartbeat_s": settings.heartbeat_s,
                           "replica": settings.replica_id, "store": None, "chains": 0,
                           "last_checkpoint": None, "state": "ok", "error": None}
    try:
        store = open_store(settings.store_url(), read_only=True, timeout_s=2.0)
        out["store"] = store.display_url
        await store.open()
        try:
            chains = [c for c in await store.list_chains() if c.replica == settings.replica_id]
            out["chains"] = len(chains)
            newest = None
            for chain in chains:
                for cp in await store.checkpoints(chain.chain):
                    if newest is None or cp.ts_us > newest.ts_us:
                        newest = cp
            if newest is not None:
                out["last_checkpoint"] = {"chain": newest.chain, "size": newest.size,
                                          "ts_us": newest.ts_us, "note": newest.note}
        finally:
            await store.close()
    except AuditError as exc:
        out["state"], out["error"] = "unavailable", str(exc)
    return out


def gateway_status(
    settings: GatewaySettings, egress: EgressRuntime | None, policy: Policy | None = None
) -> StatusSource:
    """Return the ``/status`` source of one gateway process.

    Args:
        settings: The validated settings the process runs with.
        egress: From :func:`gateway.egress.start_egress` (``None`` without a policy).
        policy: The policy serving now, when a live reload replaced the one of ``egress``.
    """
    revision = "sha256:" + config_digest(settings.model_dump_json())
    current = policy

    async def status() -> dict[str, Any]:
        policy = None
        guard: dict[str, Any] = {"mode": "off", "installed": False, "self_test": "not_run"}
        if egress is not None:
            serving = current if current is not None else egress.policy
            policy = {"revision": serving.revision, "source": serving.source,
                      "unsafe_allow_all": serving.unsafe_allow_all}
            installed = egress.guard is not None and egress.guard.installed
            guard = {"mode": egress.mode, "installed": installed,
                     "self_test": "passed" if egress.guard is not None else "not_run"}
        return {"schema": STATUS_SCHEMA, "config_revision": revision, "policy": policy,
                "guard": guard, "audit": await audit_state(settings.audit)}

    return status


_WORST = {"pass": 0, "skip": 1, "fail": 2}


def merge_preflight(summaries: Sequence[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The pod's ``preflight`` object of ``GET /status`` from its workers' (``serve --workers``).

    Each worker runs its own rounds; the pod shows, per check, the worst status over the
    workers (``fail`` > ``skip`` > ``pass``) with that worker's verdict and index, ``result``
    ``fail`` when any worker's is, ``generated_at`` of the oldest round (as the
    ``sg_preflight_last_run_timestamp_seconds`` gauge takes the minimum) and
    ``workers_reporting``.

    Args:
        summaries: Per worker, in worker order, its ``preflight`` object (``None`` before its
            first round).

    Returns:
        The merged object, or ``None`` when no worker has finished a round.
    """
    present = [(i, s) for i, s in enumerate(summaries) if s]
    if not present:
        return None
    checks: dict[str, dict[str, Any]] = {}
    for index, s in present:
        for cid, c in (s.get("checks") or {}).items():
            seen = checks.get(cid)
            if seen is None or _WORST.get(str(c.get("status")), 2) > _WORST.get(
                    str(seen["status"]), 2):
                checks[cid] = {**c, "worker": index}
    return {"generated_at": min(str(s.get("generated_at")) for _, s in present),
            "result": "fail" if any(s.get("result") != "pass" for _, s in present) else "pass",
            "interval_s": present[0][1].get("interval_s"), "checks": checks,
            "workers_reporting": len(present)}
