"""Run every pre-flight check over the collected facts and build the report."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from gateway.preflight import checks_audit as audit
from gateway.preflight import checks_cluster as cluster
from gateway.preflight import checks_identity as identity
from gateway.preflight import checks_mcp as mcp
from gateway.preflight import checks_runtime as runtime
from gateway.preflight.inputs import Criteria, Facts, Inputs, collect
from gateway.preflight.report import CheckResult, Report

__all__ = ["CHECKS", "run_checks", "run_preflight"]

#: The checks in report order (each: facts -> result).
CHECKS: tuple[Callable[[Facts], CheckResult], ...] = (
    runtime.check_destinations,
    runtime.check_allow_all,
    runtime.check_unsafe,
    runtime.check_guard,
    cluster.check_default_deny,
    cluster.check_node_regions,
    cluster.check_env,
    cluster.check_images,
    audit.check_audit_log,
    audit.check_checkpoint,
    audit.check_signing_key,
    audit.check_retention,
    runtime.check_weights,
    identity.check_identity,
    mcp.check_mcp,
)


def run_checks(facts: Facts) -> Report:
    """Run :data:`CHECKS` over ``facts`` (checks never raise for a failed criterion)."""
    now = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return Report(tuple(check(facts) for check in CHECKS), facts.inputs.describe(), now)


def run_preflight(inputs: Inputs, criteria: Criteria) -> tuple[Report, Facts]:
    """Collect the inputs and run the checks.

    Raises:
        PreflightInputError: A given input cannot be read (``gateway preflight`` exits 2).
    """
    facts = collect(inputs, criteria)
    return run_checks(facts), facts
