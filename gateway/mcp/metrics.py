"""In-process counters of MCP calls: counts by server, tool, decision and reason, and the
duration of forwarded tool calls (read by telemetry and by tests); the calls queued behind
each server's flow gate (:func:`queued_rows`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.mcp.limits import ServerGate
    from gateway.mcp.records import CallRecord

__all__ = ["McpMetrics", "queued_rows"]


def queued_rows(gates: Mapping[str, ServerGate]) -> list[tuple[tuple[str, ...], float]]:
    """``((server,), calls waiting for a slot)`` per server with a ``flow`` gate (the
    ``sg.gateway.mcp.queued`` gauge); servers without a gate have no row."""
    return [((name, ), float(gate.queued)) for name, gate in list(gates.items())]


class McpMetrics:
    """Counters of one endpoint (one process)."""

    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str, str, str]] = Counter()
        """(server, tool or method, decision, reason or "ok") -> count."""
        self.duration_us_total = 0
        self.tool_calls = 0
        self.duration_us: Counter[str] = Counter()
        """server -> total microseconds of forwarded tool calls."""

    def observe(self, rec: CallRecord) -> None:
        """Count one finished request."""
        what = rec.tool or rec.method or "-"
        self.calls[(rec.server or "-", what, rec.decision, rec.reason or "ok")] += 1
        if rec.method == "tools/call" and rec.decision == "allow":
            self.tool_calls += 1
            self.duration_us_total += rec.duration_us
            self.duration_us[rec.server or "-"] += rec.duration_us

    def call_rows(self) -> list[tuple[tuple[str, ...], float]]:
        """``((server, tool, decision, reason), count)`` rows (the telemetry's counter)."""
        return [(labels, float(n)) for labels, n in list(self.calls.items())]

    def seconds_rows(self) -> list[tuple[tuple[str, ...], float]]:
        """``((server,), seconds)`` rows of forwarded tool calls."""
        return [((server,), us / 1e6) for server, us in list(self.duration_us.items())]

    def refusals(self) -> Counter[str]:
        """Refusals by reason."""
        out: Counter[str] = Counter()
        for (_, _, decision, reason), n in self.calls.items():
            if decision != "allow" or reason != "ok":
                out[reason] += n
        return out
