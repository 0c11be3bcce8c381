"""Continuous pre-flight: the running gateway re-runs the checks it can see, on a schedule.

With a ``preflight:`` section (:class:`ContinuousSettings`) and the admin port (``telemetry:``),
``gateway serve`` runs :class:`ContinuousPreflight` every ``interval_s`` seconds. Each round
builds the pre-flight facts from what the process runs with (its settings, the policy serving
now, its own ``/status`` document) and runs the checks of a :class:`LiveChecks` registry:

``policy.destinations``, ``policy.no-allow-all``, ``policy.unsafe-off``, ``gateway.guard``
    the same check functions as ``gateway preflight`` (the policy revision the guard enforces
    is compared with the one serving after a live reload);
``audit.verify``, ``audit.checkpoint-fresh``, ``audit.retention``
    the audit chain and its signatures with ``audit_public_key``, checkpoint freshness,
    pruning against ``retention_days``;
``telemetry.destinations``
    the OTLP collector the process exports to lies inside its egress-policy destination, and
    that destination is in an allowed region and jurisdiction.

Identity (``identity.configured``) and MCP configuration (``mcp.destinations``) are among the
default checks; other checks join by :meth:`LiveChecks.register` (a function ``Facts ->
CheckResult``), without changing this module.

Results are exported on the admin port's ``/metrics`` (``sg_preflight_check{check, status}``
1 for the current status of each check, ``sg_preflight_last_run_timestamp_seconds``,
``sg_preflight_interval_seconds``, ``sg_preflight_evidence_packs_total``) and as ``preflight``
in ``GET /status``. With ``evidence_dir`` and ``sign_key_file`` a signed evidence pack (the
format of :mod:`gateway.preflight.evidence`, OSCAL documents included) is written to
``evidence_dir/<UTC time>-<replica>`` on the first round, whenever a check's status changes,
and at least once per UTC day. The checks run in a worker thread: they read files and the
audit store with blocking calls, and must not stall the event loop serving requests.
:meth:`ContinuousPreflight.shutdown` waits for a round's thread (up to
:attr:`~ContinuousPreflight.stop_wait_s`): cancelling the task does not stop a thread, and a
check must not read the audit store after the lifespan closed it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.preflight import checks_audit as audit
from gateway.preflight import checks_runtime as runtime
from gateway.preflight.checks_identity import check_identity
from gateway.preflight.checks_mcp import check_mcp
from gateway.preflight.inputs import Criteria, Facts, Inputs
from gateway.preflight.live_settings import ContinuousSettings
from gateway.preflight.report import CheckResult, Report, outcome
from gateway.serving.periodic import Periodic

__all__ = ["DEFAULT_LIVE_CHECKS", "ContinuousPreflight", "LiveCheck", "LiveChecks",
           "check_telemetry_destinations"]

_log = logging.getLogger(__name__)

#: A check of the running process: facts in, one result out (never raises for a failure).
LiveCheck = Callable[[Facts], CheckResult]
StatusSource = Callable[[], Awaitable[Mapping[str, Any]]]


def check_telemetry_destinations(facts: Facts) -> CheckResult:
    """The OTLP collector is inside its policy destination, in an allowed region."""
    from policy import PolicyError, check_binding

    cid, title, crit = ("telemetry.destinations", "telemetry goes only to a policy "
                        "destination in an allowed region", ("SOV-3", "SOV-4"))
    ts = getattr(facts.settings, "telemetry", None)
    endpoint = getattr(ts, "otlp_endpoint", None)
    if endpoint is None:
        return CheckResult(cid, title, "pass", "no OTLP export configured (nothing leaves)",
                           {"otlp_endpoint": None}, crit)
    dest_id = str(getattr(ts, "otlp_endpoint_destination", "") or "")
    evidence: dict[str, Any] = {"otlp_endpoint": endpoint, "destination": dest_id}
    if facts.policy is None:
        return CheckResult(cid, title, "fail", "OTLP export without an egress policy",
                           evidence, crit)
    problems = []
    try:
        check_binding(facts.policy, endpoint, dest_id)
        dest = facts.policy.destination(dest_id)
        evidence.update(region=dest.region, jurisdiction=dest.jurisdiction)
        c = facts.criteria
        if c.regions and dest.region not in c.regions:
            problems.append(f"collector destination {dest_id} is in region {dest.region} "
                            f"(allowed: {', '.join(c.regions)})")
        if dest.jurisdiction not in c.jurisdictions:
            problems.append(f"collector destination {dest_id} is under {dest.jurisdiction} "
                            f"(allowed: {', '.join(c.jurisdictions)})")
    except PolicyError as exc:
        problems.append(f"OTLP endpoint: {exc}")
    return outcome(cid, title, problems, f"OTLP to {dest_id} ({endpoint})", evidence, crit)


#: The checks a running gateway can see, in report order.
DEFAULT_LIVE_CHECKS: tuple[LiveCheck, ...] = (
    runtime.check_destinations, runtime.check_allow_all, runtime.check_unsafe,
    runtime.check_guard, audit.check_audit_log, audit.check_checkpoint,
    audit.check_retention, check_telemetry_destinations, check_identity, check_mcp,
)


class LiveChecks:
    """The registry of continuous checks (other features add theirs with :meth:`register`)."""

    def __init__(self, checks: Iterable[LiveCheck] = DEFAULT_LIVE_CHECKS) -> None:
        self._checks: list[LiveCheck] = list(checks)

    def register(self, check: LiveCheck) -> None:
        """Add ``check`` after the others (identity, MCP configuration, ...)."""
        self._checks.append(check)

    def run(self, facts: Facts) -> Report:
        """Run every check over ``facts`` (blocking: call it from a worker thread).

        A check that raises fails (named by its function) and the others still run: one
        broken check must not silence the rest.
        """
        now = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
        return Report(tuple(_guarded(check, facts) for check in self._checks),
                      {"source": "continuous pre-flight of the running gateway"}, now)


def _retrieve(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def _guarded(check: LiveCheck, facts: Facts) -> CheckResult:
    try:
        return check(facts)
    except Exception as exc:  # any failure of the check itself is a failed check
        _log.exception("continuous pre-flight check %s raised", check)
        name = getattr(check, "__name__", repr(check)).removeprefix("check_")
        return CheckResult(f"check.{name}", "the check ran", "fail",
                           f"the check raised {type(exc).__name__}: {exc}")


class _Collector(Collector):
    def __init__(self, owner: ContinuousPreflight) -> None:
        self._owner = owner

    def collect(self) -> Iterator[GaugeMetricFamily]:
        o = self._owner
        checks = GaugeMetricFamily("sg_preflight_check", "Continuous pre-flight: 1 for the "
                                   "current status of each check", labels=["check", "status"])
        if o.report is not None:
            for c in o.report.checks:
                for status in ("pass", "fail", "skip"):
                    checks.add_metric([c.id, status], 1.0 if c.status == status else 0.0)
        yield checks
        yield GaugeMetricFamily("sg_preflight_last_run_timestamp_seconds",
                                "End of the last continuous pre-flight round (Unix time)",
                                value=o.last_run_s or 0.0)
        yield GaugeMetricFamily("sg_preflight_interval_seconds",
                                "Configured interval of the continuous pre-flight",
                                value=o.settings.interval_s)
        yield GaugeMetricFamily("sg_preflight_evidence_packs_total",
                                "Signed evidence packs written by this process",
                                value=float(o.packs_written))


class ContinuousPreflight(Periodic):
    """Runs :class:`LiveChecks` every ``settings.interval_s`` seconds inside ``gateway serve``.

    Args:
        settings: The ``preflight:`` section.
        gateway_settings: The settings the process runs with (replaced by :meth:`rebind`).
        policy: The policy serving now (``None`` without one).
        status: The process's ``/status`` source (:func:`gateway.preflight.gateway_status`).
        checks: The registry (default: :data:`DEFAULT_LIVE_CHECKS`).
        replica: Names the packs this process writes.

    Attributes:
        report: The latest report (``None`` before the first round).
        last_run_s: Unix time the latest round ended.
        packs_written: Evidence packs written since start.
    """

    round_name = "continuous pre-flight"
    #: Seconds :meth:`shutdown` waits for a round's worker thread to end.
    stop_wait_s = 30.0

    def __init__(self, settings: ContinuousSettings, gateway_settings: Any, policy: Any,
                 status: StatusSource, checks: LiveChecks | None = None,
                 replica: str = "gateway") -> None:
        self.settings = settings
        self.interval_s = settings.interval_s
        self._gateway_settings, self._policy, self._status = gateway_settings, policy, status
        self.checks = checks or LiveChecks()
        self.replica = replica
        self.report: Report | None = None
        self.last_run_s: float | None = None
        self.packs_written = 0
        self._last_pack: tuple[str, tuple[tuple[str, str], ...]] | None = None
        self._inflight: asyncio.Future[Any] | None = None

    def collector(self) -> Collector:
        """A Prometheus collector of the results (register it on the admin registry)."""
        return _Collector(self)

    def rebind(self, gateway_settings: Any, policy: Any, status: StatusSource) -> None:
        """Check what a live reload put in service from the next round on."""
        self._gateway_settings, self._policy, self._status = gateway_settings, policy, status

    async def startup(self) -> None:
        """Start the rounds (lifespan hook)."""
        self.start()

    async def shutdown(self) -> None:
        """Stop the rounds and wait for a round's thread to end (lifespan hook).

        A thread cannot be cancelled: the round's checks (or pack) finish, up to
        :attr:`stop_wait_s` seconds; a longer one is logged and left to end alone.
        """
        await self.stop()
        inflight = self._inflight
        if inflight is not None and not inflight.done():
            done, _ = await asyncio.wait({inflight}, timeout=self.stop_wait_s)
            if not done:
                _log.warning("continuous pre-flight: a round still runs %.0f s after shutdown",
                             self.stop_wait_s)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in a worker thread, tracked so that :meth:`shutdown` can wait for it."""
        fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        fut.add_done_callback(_retrieve)  # a result nobody awaits after a cancel is not an error
        self._inflight = fut
        return await asyncio.shield(fut)

    def summary(self) -> dict[str, Any] | None:
        """The ``preflight`` object of ``GET /status`` (``None`` before the first round)."""
        if self.report is None:
            return None
        return {"generated_at": self.report.generated_at,
                "result": "fail" if self.report.exit_code else "pass",
                "interval_s": self.settings.interval_s,
                "checks": {c.id: {"status": c.status, "verdict": c.verdict}
                           for c in self.report.checks}}

    def status_with_results(self, source: StatusSource) -> StatusSource:
        """``source`` with the latest results added as ``preflight``."""
        async def status() -> Mapping[str, Any]:
            return {**(await source()), "preflight": self.summary()}
        return status

    async def run_once(self) -> None:
        """One round: facts from the process, checks in a thread, metrics, maybe a pack."""
        loop = type(asyncio.get_running_loop())
        status = {**(await self._status()), "loop": f"{loop.__module__}.{loop.__qualname__}"}
        s = self.settings
        facts = Facts(Inputs(audit_public_key=s.audit_public_key),
                      Criteria(regions=tuple(s.regions), jurisdictions=tuple(s.jurisdictions),
                               retention_days=s.retention_days))
        facts.settings, facts.policy, facts.status = self._gateway_settings, self._policy, status
        report = await self._in_thread(self.checks.run, facts)
        self.report, self.last_run_s = report, time.time()
        for c in report.checks:
            if c.status == "fail":
                _log.warning("continuous pre-flight: %s failed: %s", c.id, c.verdict)
        if s.evidence_dir is not None and s.sign_key_file is not None:
            await self._in_thread(self.write_pack_if_due, report, facts)

    def write_pack_if_due(self, report: Report, facts: Facts) -> Path | None:
        """Write a signed pack unless one was written today with the same statuses.

        Returns:
            The pack directory, or ``None`` when none was due.

        Raises:
            EvidenceError: The pack cannot be written (the next round tries again).
        """
        from gateway.preflight.evidence import evidence_files, write_pack
        from gateway.preflight.oscal import oscal_files

        assert self.settings.evidence_dir is not None and self.settings.sign_key_file
        day = report.generated_at[:10]
        statuses = tuple((c.id, c.status) for c in report.checks)
        if self._last_pack == (day, statuses):
            return None
        stamp = report.generated_at.replace("-", "").replace(":", "")
        out = self.settings.evidence_dir / f"{stamp}-{self.replica.replace('/', '_')}"
        n = 1
        while out.exists():
            n += 1
            out = out.with_name(f"{stamp}-{self.replica.replace('/', '_')}-{n}")
        evidence = evidence_files(report, facts)
        extra = oscal_files(report, evidence)
        write_pack(out, report, facts, self.settings.sign_key_file, extra, evidence=evidence)
        self._last_pack = (day, statuses)
        self.packs_written += 1
        _log.info("continuous pre-flight: evidence pack %s (%s)", out,
                  "fail" if report.exit_code else "pass")
        return out

