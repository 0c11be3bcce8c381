"""One streamed chat completion with every feature on crosses a bounded set of project modules.

Runs ``bench/trace_modules.py`` (a ``sys.setprofile`` trace of one request through the gateway
as ``gateway serve`` assembles it). The target is 15 modules; the code is at 33 (32 after the
assembly redesign, plus ``gateway.http_guard``'s framing check at the ASGI edge; see
docs/architecture.md), so the bound here keeps the count from growing while that is open.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gateway.assembly import STAGES

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULES = 33


def test_a_streamed_request_crosses_a_bounded_set_of_modules() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "trace_modules.py"), "--json",
         "--max", str(MAX_MODULES)],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    modules = set(report["modules"])
    # Every feature was on and took part in the request.
    assert {"gateway.relay", "gateway.forward", "gateway.audit.observer",
            "gateway.audit.writer", "gateway.quotas.hook", "gateway.telemetry.service",
            "gateway.egress", "policy.evaluate"} <= modules, sorted(modules)
    # No ASGI wrapper: the observers are reached only through the relay's hooks.
    assert report["count"] == len(modules)
    assert report["count"] <= MAX_MODULES, sorted(modules)
    assert result.returncode == 0


def test_the_stages_are_written_once_in_order() -> None:
    assert STAGES == ("authenticate", "classify", "route", "admit", "audit", "forward",
                      "account")
