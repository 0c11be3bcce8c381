"""What a verification run reports: its findings, each naming a chain and a sequence number,
and a summary per chain (:class:`VerifyReport`); and the collector the checks write findings
into (:class:`Findings`), which bounds them per chain and opens checkpoint notes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from gateway.audit.checkpoint import (
    Checkpoint,
    Verifier,
    open_checkpoint,
    parse_checkpoint_unverified,
)
from gateway.audit.errors import AuditFormatError, ProofError

Severity = Literal["error", "warning"]
_MAX_FINDINGS_PER_CHAIN = 50


@dataclass(frozen=True)
class Finding:
    """One verification result.

    Attributes:
        severity: ``error`` (tampering or loss) or ``warning``.
        code: Stable machine code, e.g. ``hash_mismatch``.
        chain: Chain id, if the finding is about one chain.
        seq: Sequence number (record position) concerned, if any.
        message: Human-readable explanation.
    """

    severity: Severity
    code: str
    chain: str | None
    seq: int | None
    message: str

    def __str__(self) -> str:
        where = self.chain or "-"
        if self.seq is not None:
            where += f" seq {self.seq}"
        return f"{self.severity.upper()} {self.code} [{where}]: {self.message}"


@dataclass
class ChainSummary:
    """Per-chain statistics of a verification run."""

    chain: str
    records: int = 0
    sealed_size: int = 0
    checkpoints: int = 0
    closed: bool = False


@dataclass
class VerifyReport:
    """Result of :func:`verify_store`: ``ok`` is True when there is no error.

    ``accepted_unsealed`` lists the chains that failed only for want of a trusted checkpoint
    and were accepted because the caller named them (``--allow-unsealed``): their records
    are not authenticated.
    """

    store: str
    signatures_checked: bool
    chains: list[ChainSummary] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    accepted_unsealed: list[str] = field(default_factory=list)

    @property
    def errors(self) -> list[Finding]:
        """Findings of severity ``error``."""
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        """Findings of severity ``warning``."""
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def ok(self) -> bool:
        """True when no error was found (warnings allowed)."""
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for ``--json``)."""
        return {
            "ok": self.ok,
            "store": self.store,
            "signatures_checked": self.signatures_checked,
            "records": sum(c.records for c in self.chains),
            "chains": [asdict(c) for c in self.chains],
            "findings": [asdict(f) for f in self.findings],
            "accepted_unsealed": list(self.accepted_unsealed),
        }


class Findings:
    """The findings of one run, written into its report: at most 50 per chain (the 51st says
    the rest were left out), and the checkpoint notes opened with the run's trusted keys."""

    def __init__(self, report: VerifyReport, verifiers: Sequence[Verifier]) -> None:
        self.report = report
        self.verifiers = verifiers
        self._count: dict[str | None, int] = {}

    def add(self, sev: Severity, code: str, chain: str | None, seq: int | None, msg: str) -> None:
        """Record one finding about ``chain`` (``None``: the store) at record ``seq``."""
        n = self._count.get(chain, 0)
        self._count[chain] = n + 1
        if n == _MAX_FINDINGS_PER_CHAIN:
            msg, code = "too many findings; further findings of this chain omitted", "truncated"
        elif n > _MAX_FINDINGS_PER_CHAIN:
            return
        self.report.findings.append(Finding(sev, code, chain, seq, msg))

    def open_note(self, note: str, chain: str | None, source: str) -> Checkpoint | None:
        """The checkpoint ``note`` (signature checked when keys were given), or ``None`` with a
        ``bad_signature`` or ``malformed_checkpoint`` finding naming ``source``."""
        try:
            if self.verifiers:
                return open_checkpoint(note, self.verifiers)
            return parse_checkpoint_unverified(note)
        except ProofError as exc:
            size = None
            with contextlib.suppress(AuditFormatError):
                size = parse_checkpoint_unverified(note).size
            self.add("error", "bad_signature", chain, size, f"{source} (size {size}): {exc}")
        except AuditFormatError as exc:
            self.add("error", "malformed_checkpoint", chain, None, f"{source}: {exc}")
        return None
