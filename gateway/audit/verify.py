"""Offline verification of an audit store.

:func:`verify_store` re-reads every chain and reports findings, each naming its chain and
sequence number; it never returns a bare bool. Checks, per chain:

* every record is canonical JSON of the record shape, its stored hash equals
  ``SHA-256(0x00 || body)``, it names its chain, and sequence numbers run 0, 1, 2, ... without
  gap, duplicate or reordering (``missing_records``, ``out_of_order``);
* each record's ``prev`` equals the previous record's recomputed hash (``broken_link``);
* the first record is ``chain.started``; the chain it names as its predecessor exists and still
  holds the tail and checkpoint it named (``previous_chain_truncated``);
* every stored checkpoint is a well-formed C2SP note, signed by a trusted key (when keys are
  given), for this origin, whose root equals the RFC 6962 root recomputed from the records at
  its size (``checkpoint_mismatch``), and sizes never shrink over time (``checkpoint_shrank``);
  a checkpoint larger than the stored chain means records were deleted (``truncated``);
* consecutive records more than ``max_gap_s`` apart (default ``2 * heartbeat + 1 s`` from the
  chain's start record) are a failure (``time_gap``): a live writer heartbeats;
* records after the newest valid checkpoint are reported as ``unsealed`` (warning);
* with a checkpoint directory, every exported checkpoint must be matched by the store: a
  store holding fewer records, or other records, than an exported checkpoint was rolled back
  or forked (``rollback``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from gateway.audit.checkpoint import (
    Checkpoint,
    Verifier,
    open_checkpoint,
    parse_checkpoint_unverified,
)
from gateway.audit.errors import AuditConfigError, AuditFormatError, ProofError
from gateway.audit.merkle import CompactRange
from gateway.audit.records import (
    CHAIN_CLOSED,
    CHAIN_STARTED,
    GENESIS_PREV,
    canonical_json,
    parse_body,
    record_hash,
)
from gateway.audit.store import Store

Severity = Literal["error", "warning"]
_PAGE = 5000
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
    """Result of :func:`verify_store`: ``ok`` is True when there is no error."""

    store: str
    signatures_checked: bool
    chains: list[ChainSummary] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

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
        }


@dataclass
class _ChainPlan:
    """What must be checked for one chain, collected before reading its records."""

    chain: str
    start: dict[str, Any] | None = None
    notes: list[tuple[str, str, int]] = field(default_factory=list)  # (source, note, ts_us)
    required_tail: tuple[int, str, str] | None = None  # (size, hash hex, named by chain)


def _load_checkpoint_dir(directory: Path) -> list[tuple[Path, str]]:
    if not directory.is_dir():
        raise AuditConfigError(f"checkpoint directory {directory} does not exist")
    out = []
    for path in sorted(directory.glob("*.ckpt")):
        try:
            out.append((path, path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise AuditConfigError(f"cannot read checkpoint {path}: {exc}") from exc
    return out


class _Verifier:
    def __init__(self, report: VerifyReport, verifiers: Sequence[Verifier]) -> None:
        self.report = report
        self.verifiers = verifiers
        self._count: dict[str | None, int] = {}

    def add(self, sev: Severity, code: str, chain: str | None, seq: int | None, msg: str) -> None:
        n = self._count.get(chain, 0)
        self._count[chain] = n + 1
        if n == _MAX_FINDINGS_PER_CHAIN:
            msg, code = "too many findings; further findings of this chain omitted", "truncated"
        elif n > _MAX_FINDINGS_PER_CHAIN:
            return
        self.report.findings.append(Finding(sev, code, chain, seq, msg))

    def open_note(self, note: str, chain: str | None, source: str) -> Checkpoint | None:
        try:
            if self.verifiers:
                return open_checkpoint(note, self.verifiers)
            return parse_checkpoint_unverified(note)
        except ProofError as exc:
            self.add("error", "bad_signature", chain, None, f"{source}: {exc}")
        except AuditFormatError as exc:
            self.add("error", "malformed_checkpoint", chain, None, f"{source}: {exc}")
        return None


async def verify_store(
    store: Store,
    *,
    verifiers: Sequence[Verifier] = (),
    checkpoint_dir: Path | None = None,
    max_gap_s: float | None = None,
) -> VerifyReport:
    """Verify every chain of an (open) store; see the module docstring for the checks.

    Args:
        store: An opened store.
        verifiers: Trusted checkpoint keys; without any, signatures are not checked (warning).
        checkpoint_dir: Directory of exported checkpoints (rollback detection).
        max_gap_s: Largest allowed time between consecutive records of a chain, seconds;
            default ``2 * heartbeat + 1`` from each chain's start record.

    Returns:
        The report (``report.ok`` is False if anything was tampered with or lost).

    Raises:
        AuditUnavailable: If the store cannot be read.
        AuditConfigError: If the checkpoint directory cannot be read.
    """
    report = VerifyReport(store.display_url, signatures_checked=bool(verifiers))
    v = _Verifier(report, verifiers)
    if not verifiers:
        v.add("warning", "signatures_not_checked", None, None, "no public key given")
    chains = await store.list_chains()
    plans = {c.chain: _ChainPlan(c.chain) for c in chains}
    for c in chains:
        first = await store.read_records(c.chain, 0, 1)
        with contextlib.suppress(AuditFormatError):
            if first and first[0].seq == 0:
                obj = parse_body(first[0].body)
                if obj["type"] == CHAIN_STARTED:
                    plans[c.chain].start = obj["data"]
        for cp in await store.checkpoints(c.chain):
            plans[c.chain].notes.append(("store", cp.note, cp.ts_us))
    for chain, plan in plans.items():
        start = plan.start or {}
        prev_chain = start.get("previous_chain")
        if not isinstance(prev_chain, str):
            continue
        if prev_chain not in plans:
            v.add(
                "error",
                "previous_chain_missing",
                chain,
                0,
                f"start record names previous chain {prev_chain}, which is not in the store",
            )
            continue
        tail = start.get("previous_tail")
        if isinstance(tail, dict):
            plans[prev_chain].required_tail = (int(tail["size"]), str(tail["hash"]), chain)
        named = start.get("previous_checkpoint")
        if isinstance(named, dict) and isinstance(named.get("note"), str):
            plans[prev_chain].notes.append((f"named by {chain}", named["note"], -1))
    if checkpoint_dir is not None:
        for path, note in _load_checkpoint_dir(checkpoint_dir):
            dcp = v.open_note(note, None, str(path))
            if dcp is None:
                continue
            if dcp.origin not in plans:
                v.add(
                    "error",
                    "rollback",
                    dcp.origin,
                    0,
                    f"{path} seals {dcp.size} records of a chain the store does not hold",
                )
                continue
            plans[dcp.origin].notes.append((f"exported {path.name}", note, -1))
    for plan in plans.values():
        report.chains.append(await _verify_chain(store, plan, v, max_gap_s))
    return report


async def _verify_chain(
    store: Store, plan: _ChainPlan, v: _Verifier, max_gap_s: float | None
) -> ChainSummary:
    chain = plan.chain
    summary = ChainSummary(chain)
    checkpoints: list[tuple[str, Checkpoint, int]] = []
    for source, note, ts_us in plan.notes:
        cp = v.open_note(note, chain, f"checkpoint ({source})")
        if cp is None:
            continue
        if cp.origin != chain:
            v.add(
                "error",
                "checkpoint_mismatch",
                chain,
                None,
                f"checkpoint ({source}) is for origin {cp.origin}",
            )
            continue
        checkpoints.append((source, cp, ts_us))
    wanted = {cp.size for _, cp, _ in checkpoints}
    if plan.required_tail:
        wanted.add(plan.required_tail[0])
    roots: dict[int, bytes] = {}
    hashes_at: dict[int, bytes] = {}
    gap_us = None
    if max_gap_s is not None:
        gap_us = int(max_gap_s * 1_000_000)
    elif plan.start and isinstance(plan.start.get("heartbeat_ms"), int):
        gap_us = (2 * plan.start["heartbeat_ms"] + 1000) * 1000
    rng = CompactRange()
    expected = 0
    prev_hash = bytes.fromhex(GENESIS_PREV)
    prev_ts: int | None = None
    last_type = None
    pos = 0
    while True:
        page = await store.read_records(chain, pos, _PAGE)
        for rec in page:
            pos = rec.seq + 1
            h = record_hash(rec.body)
            seq_ok = True
            try:
                obj = parse_body(rec.body)
                if canonical_json(obj) != rec.body:
                    v.add("error", "non_canonical", chain, expected, "record is not canonical JSON")
            except AuditFormatError as exc:
                v.add("error", "malformed_record", chain, expected, str(exc))
                obj = None
            if h != rec.hash:
                v.add(
                    "error",
                    "hash_mismatch",
                    chain,
                    expected,
                    "record content does not match its stored hash (record modified)",
                )
            if obj is not None:
                if obj["chain"] != chain:
                    v.add(
                        "error",
                        "wrong_chain",
                        chain,
                        expected,
                        f"record claims chain {obj['chain']}",
                    )
                seq = obj["seq"]
                if seq > expected:
                    seq_ok = False
                    v.add(
                        "error",
                        "missing_records",
                        chain,
                        expected,
                        f"records {expected}..{seq - 1} missing (next stored record is {seq})",
                    )
                    expected = seq
                elif seq < expected:
                    seq_ok = False
                    v.add(
                        "error",
                        "out_of_order",
                        chain,
                        expected,
                        f"found record {seq} at position {expected} (reordered or duplicated)",
                    )
                if seq_ok and obj["prev"] != prev_hash.hex():
                    v.add(
                        "error",
                        "broken_link",
                        chain,
                        expected,
                        "prev does not match the hash of the preceding record",
                    )
                if expected == 0 and obj["type"] != CHAIN_STARTED:
                    v.add(
                        "error",
                        "missing_start",
                        chain,
                        0,
                        "chain does not begin with chain.started",
                    )
                ts = obj["ts_us"]
                if prev_ts is not None and gap_us is not None and ts - prev_ts > gap_us:
                    v.add(
                        "error",
                        "time_gap",
                        chain,
                        expected,
                        f"{(ts - prev_ts) / 1e6:.1f} s since the previous record exceeds the "
                        f"{gap_us / 1e6:.1f} s heartbeat bound (records deleted or writer stalled)",
                    )
                prev_ts = ts
                last_type = obj["type"]
            prev_hash = h
            rng.append(h)
            expected += 1
            if rng.size in wanted:
                roots[rng.size] = rng.root()
                hashes_at[rng.size] = h
        if len(page) < _PAGE:
            break
    size = rng.size
    summary.records = size
    summary.closed = last_type == CHAIN_CLOSED
    last_size, sealed = -1, 0
    for source, cp, ts_us in sorted(checkpoints, key=lambda x: (x[2] < 0, x[2])):
        summary.checkpoints += 1
        if cp.size > size:
            code = "rollback" if source.startswith("exported") else "truncated"
            v.add(
                "error",
                code,
                chain,
                size,
                f"checkpoint ({source}) seals {cp.size} records but the store holds {size}: "
                f"records {size}..{cp.size - 1} deleted or the store was restored from a copy",
            )
            continue
        if cp.size and roots.get(cp.size) != cp.root:
            code = "rollback" if source.startswith("exported") else "checkpoint_mismatch"
            v.add(
                "error",
                code,
                chain,
                cp.size - 1,
                f"checkpoint ({source}) of size {cp.size} does not match the stored records",
            )
            continue
        if ts_us >= 0:
            if cp.size < last_size:
                v.add(
                    "error",
                    "checkpoint_shrank",
                    chain,
                    cp.size,
                    f"checkpoint of size {cp.size} signed after one of size {last_size}",
                )
            last_size = max(last_size, cp.size)
        sealed = max(sealed, cp.size)
    summary.sealed_size = sealed
    if plan.required_tail:
        t_size, t_hash, by = plan.required_tail
        if size < t_size:
            v.add(
                "error",
                "previous_chain_truncated",
                chain,
                size,
                f"{by} recorded {t_size} records of this chain at its start; {size} remain",
            )
        elif hashes_at.get(t_size, b"").hex() != t_hash:
            v.add(
                "error",
                "previous_chain_truncated",
                chain,
                t_size - 1,
                f"record {t_size - 1} differs from the tail hash recorded by {by}",
            )
    if size > sealed:
        v.add(
            "warning",
            "unsealed",
            chain,
            sealed,
            f"records {sealed}..{size - 1} are not covered by a signed checkpoint",
        )
    if not summary.closed:
        v.add(
            "warning",
            "not_closed",
            chain,
            None,
            "chain has no chain.closed record (writer still running, or it crashed)",
        )
    return summary
