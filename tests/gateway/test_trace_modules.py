"""One streamed chat completion with every feature on crosses a bounded set of project modules,
and runs the relay's stages in the order of the one list that names them.

Runs ``bench/trace_modules.py``: a ``sys.setprofile`` trace of one request sent over a real TCP
connection to the gateway as ``gateway serve`` builds it (assembly, app and its own HTTP
server), from the first bytes the server reads to the last chunk the client reads. The
request's own calls are bounded; the audit log's group-commit task, which builds, hashes and
stores the records of all requests in batches and which the response waits for, is reported
beside them (see docs/architecture.md).

The bound is the count measured over the socket (the server side of ``gateway.h1`` counts too;
the relay paths go from the server straight to the relay's entry, as with ``gateway serve``);
it may only go down. It was 15 (issue 29's bound) until the sockets' transport became our own
(``gateway.h1.transport``, where asyncio's socket transport, not counted, was): the same
path, one module more to read, for ~100 us of CPU less per new connection
(docs/architecture.md, "The request path in modules").
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gateway.assembly import STAGES
from gateway.relay import pipeline

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULES = 16


def test_a_streamed_request_crosses_a_bounded_set_of_modules() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "trace_modules.py"), "--json",
         "--max", str(MAX_MODULES)],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    modules = set(report["modules"])
    # Every feature was on and took part in the request: through its one per-request object
    # (audit observer, quota hook and its backend, telemetry observer) ...
    assert {"gateway.h1.server", "gateway.h1.framing", "gateway.relay.pipeline",
            "gateway.relay.forward", "gateway.routing", "gateway.audit.observer",
            "gateway.audit.writer", "gateway.quotas.hook", "gateway.quotas.memory",
            "gateway.telemetry.tracing"} <= modules, sorted(modules)
    # ... the egress policy decided the route at assembly (the route table) and is not asked
    # again per request; its rule is in the request's audit records ...
    assert not {m for m in modules if m == "policy" or m.startswith("policy.")}, sorted(modules)
    assert "gateway.egress" not in modules
    evidence = report["evidence"]
    assert evidence["policy_rule"] == "public-anywhere"
    # ... both audit records are durable (the group commit the response waited for) and the
    # quota headers were sent.
    assert evidence["audit_records"] == ["request.started", "request.completed"]
    assert {"gateway.audit.records", "gateway.audit.store_sqlite"} <= set(report["committer"])
    assert "x-ratelimit-remaining-requests" in evidence["ratelimit_headers"]
    # No ASGI wrapper: the observers are reached only through the relay's hooks.
    assert report["count"] == len(modules)
    assert report["count"] <= MAX_MODULES, sorted(modules)
    assert result.returncode == 0
    # The relay ran its stages in the order of the list that names them (the trace saw each
    # stage's function called, first call first).
    assert report["stages"] == [stage.name for stage in pipeline.STAGES]


def test_the_stages_are_written_once_in_order() -> None:
    assert STAGES == tuple(stage.name for stage in pipeline.STAGES) == (
        "authenticate", "classify", "read", "inspect", "route", "admit", "audit", "forward",
        "account")
    # Only the last one runs whatever happened.
    assert [stage.always for stage in pipeline.STAGES] == [False] * 8 + [True]
