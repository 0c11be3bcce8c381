"""The pre-flight report: check results, the criteria they evidence, JSON and Markdown forms.

A :class:`CheckResult` has an ``id``, a one-line ``verdict``, the ``evidence`` it looked at
(JSON-serialisable, never secret) and the ``criteria`` it maps to (keys of :data:`CRITERIA`).
:class:`Report` adds the inputs given and the criteria left open as manual attestations
(:data:`MANUAL_ATTESTATIONS`).

Exit codes (:attr:`Report.exit_code`): 0 every required check passed or was skipped,
1 a required check failed. ``gateway preflight`` exits 2 when it could not run at all.

Sources of the criteria: EU Cloud Sovereignty Framework v1.2.1 (European Commission, DG DIGIT,
October 2025), Sovereignty Objectives SOV-1..SOV-8; Regulation (EU) 2024/1689 (AI Act)
Art. 12 (record-keeping) and Art. 26(6) (deployers keep logs at least six months).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["CRITERIA", "MANUAL_ATTESTATIONS", "REPORT_SCHEMA", "CheckResult", "Report", "Status",
           "outcome", "skipped"]

REPORT_SCHEMA = "sovereign-gateway/preflight-report/v1"

Status = Literal["pass", "fail", "skip"]

#: Criterion id -> what it asks (short form; see docs/preflight.md for the sources).
CRITERIA: dict[str, str] = {
    "SOV-2": "EU Cloud Sovereignty Framework SOV-2 Legal & Jurisdictional Sovereignty: "
             "processing under EU jurisdiction, no channel for third-country access",
    "SOV-3": "EU Cloud Sovereignty Framework SOV-3 Data & AI Sovereignty: EU-only "
             "processing without fallbacks, complete access logs, control over models",
    "SOV-4": "EU Cloud Sovereignty Framework SOV-4 Operational Sovereignty: operation "
             "without dependence on non-EU services",
    "SOV-5": "EU Cloud Sovereignty Framework SOV-5 Supply Chain Sovereignty: provenance "
             "of the software and artefacts run",
    "SOV-7": "EU Cloud Sovereignty Framework SOV-7 Security & Compliance: verifiable "
             "security controls and audit evidence",
    "AIA-12": "AI Act Art. 12: automatic recording of events (logs) over the lifetime of "
              "the system, enabling traceability",
    "AIA-26(6)": "AI Act Art. 26(6): deployers keep the automatically generated logs under "
                 "their control for at least six months",
}

#: Criteria no software check can settle; the report lists them as open.
MANUAL_ATTESTATIONS: tuple[dict[str, str], ...] = (
    {"criterion": "SOV-1", "attest": "The operator and the cloud/hosting provider are "
     "EU-owned and EU-governed; no non-EU change of control."},
    {"criterion": "SOV-2", "attest": "Contracts put the service under EU law and EU courts; "
     "no provider is subject to extraterritorial access laws (e.g. US CLOUD Act)."},
    {"criterion": "SOV-4", "attest": "Staff with administrative access and support are in "
     "the EU; an exit/migration plan exists."},
    {"criterion": "SOV-5", "attest": "Hardware and firmware origin of the nodes and GPUs, and "
     "the provenance of the mirrored images, have been assessed."},
    {"criterion": "SOV-7", "attest": "The cluster's own control plane, etcd encryption and "
     "node access are hardened and independently audited."},
    {"criterion": "SOV-8", "attest": "Energy and carbon reporting of the data centre."},
    {"criterion": "AIA-26(6)", "attest": "The audit store's backups and storage class keep "
     "the logs for the declared retention (not checked beyond the declaration)."},
)


@dataclass(frozen=True, slots=True)
class CheckResult:
    """The outcome of one check.

    Attributes:
        id: Stable check id (``policy.destinations``, ``k8s.default-deny``, ...).
        title: What the check asks, one short line.
        status: ``pass``, ``fail`` or ``skip`` (an input was not given).
        verdict: One line: why it passed, failed or was skipped.
        evidence: What it looked at (JSON-serialisable; never secrets).
        criteria: Keys of :data:`CRITERIA` it evidences.
        required: Whether a failure makes the run fail (all checks are, today).
    """

    id: str
    title: str
    status: Status
    verdict: str
    evidence: dict[str, Any] = field(default_factory=dict)
    criteria: tuple[str, ...] = ()
    required: bool = True

    def to_json(self) -> dict[str, Any]:
        """The check as a JSON object (keys as the attributes)."""
        return {"id": self.id, "title": self.title, "status": self.status,
                "verdict": self.verdict, "required": self.required,
                "criteria": list(self.criteria), "evidence": self.evidence}


def skipped(cid: str, title: str, why: str, criteria: tuple[str, ...]) -> CheckResult:
    """A check skipped because an input it needs was not given (``why`` names it)."""
    return CheckResult(cid, title, "skip", why, {}, criteria)


def outcome(cid: str, title: str, problems: list[str], ok: str, evidence: dict[str, Any],
            criteria: tuple[str, ...]) -> CheckResult:
    """``fail`` with the ``problems`` joined by ``; ``, else ``pass`` with the verdict ``ok``."""
    if problems:
        return CheckResult(cid, title, "fail", "; ".join(problems), evidence, criteria)
    return CheckResult(cid, title, "pass", ok, evidence, criteria)


@dataclass(frozen=True, slots=True)
class Report:
    """All check results of one run.

    Attributes:
        checks: In the order they ran.
        inputs: Which inputs were given (paths, URLs without credentials).
        generated_at: ISO 8601 UTC time of the run.
    """

    checks: tuple[CheckResult, ...]
    inputs: dict[str, Any]
    generated_at: str

    @property
    def exit_code(self) -> int:
        """0 when no required check failed, else 1."""
        return 1 if any(c.status == "fail" and c.required for c in self.checks) else 0

    def counts(self) -> dict[str, int]:
        """Number of checks per status."""
        return {s: sum(1 for c in self.checks if c.status == s) for s in ("pass", "fail", "skip")}

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON object (schema :data:`REPORT_SCHEMA`)."""
        return {
            "schema": REPORT_SCHEMA, "generated_at": self.generated_at,
            "result": "fail" if self.exit_code else "pass", "counts": self.counts(),
            "inputs": self.inputs, "checks": [c.to_json() for c in self.checks],
            "criteria": CRITERIA, "manual_attestations": list(MANUAL_ATTESTATIONS),
        }

    def to_lines(self, width: int = 80) -> list[str]:
        """The report as text lines: ``STATUS  check-id  verdict`` per check, then the result.

        Args:
            width: Columns to fit (the terminal's; 80 when not on one, as every CLI here). A
                verdict that does not fit goes on under its own column on the next lines,
                broken at spaces; a word longer than that column (a path) keeps a line of its
                own, whole, so that it can still be copied and grepped.

        Returns:
            The lines, without line ends.
        """
        import textwrap

        lines: list[str] = []
        for c in self.checks:
            head = f"{c.status.upper():4}  {c.id:24} "
            lines += textwrap.wrap(head + c.verdict, width=max(width, len(head) + 20),
                                   subsequent_indent=" " * len(head), break_long_words=False,
                                   break_on_hyphens=False) or [head.rstrip()]
        n = self.counts()
        lines.append(f"{'FAIL' if self.exit_code else 'PASS'}: {n['pass']} passed, "
                     f"{n['fail']} failed, {n['skip']} skipped")
        return lines

    def to_markdown(self) -> str:
        """A human-readable page (GitHub-flavoured Markdown)."""
        c = self.counts()
        out = [
            "# sovereign-gateway pre-flight report", "",
            f"Generated {self.generated_at}. Result: **{'FAIL' if self.exit_code else 'PASS'}** "
            f"({c['pass']} passed, {c['fail']} failed, {c['skip']} skipped).", "",
            "| Check | Status | Verdict | Criteria |", "|---|---|---|---|",
        ]
        for r in self.checks:
            verdict = r.verdict.replace("|", "\\|")
            out.append(f"| `{r.id}` | {r.status.upper()} | {verdict} | "
                       f"{', '.join(r.criteria)} |")
        out += ["", "## Inputs", ""]
        out += [f"- {k}: `{v}`" for k, v in sorted(self.inputs.items()) if v not in (None, [], "")]
        out += ["", "## Criteria", ""]
        out += [f"- **{k}**: {v}" for k, v in CRITERIA.items()]
        out += ["", "## Open manual attestations (not checked by software)", ""]
        out += [f"- [ ] **{m['criterion']}**: {m['attest']}" for m in MANUAL_ATTESTATIONS]
        return "\n".join(out) + "\n"
