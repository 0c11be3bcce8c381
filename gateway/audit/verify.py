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
* every chain but a replica's first names its predecessor (``previous_chain_unlinked``);
* records after the newest valid checkpoint are reported as ``unsealed`` (warning), or as
  ``missing_checkpoint`` (error) when the chain is closed: a clean close always signs a final
  checkpoint;
* the stored columns outside the hash (``ts_us``, ``type``, ``request_id``), by which ``prove``,
  ``tail`` and ``export`` select records, repeat the hashed body (``column_mismatch``);
* with a checkpoint directory, every exported checkpoint must be matched by the store: a
  store holding fewer records, or other records, than an exported checkpoint was rolled back
  or forked (``rollback``).
"""

from __future__ import annotations

import contextlib
import itertools
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
    Record,
    canonical_json,
    parse_body,
    record_hash,
)
from gateway.audit.store import ChainInfo, Store, replica_of

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
            size = None
            with contextlib.suppress(AuditFormatError):
                size = parse_checkpoint_unverified(note).size
            self.add("error", "bad_signature", chain, size, f"{source} (size {size}): {exc}")
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
    _check_unlinked(chains, plans, v)
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
            if isinstance(tail.get("size"), int) and isinstance(tail.get("hash"), str):
                plans[prev_chain].required_tail = (tail["size"], tail["hash"], chain)
            else:
                v.add("error", "malformed_record", chain, 0, "previous_tail is malformed")
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


class _Scan:
    """Streaming per-record checks of one chain (positions are the stored seq column)."""

    def __init__(self, chain: str, v: _Verifier, gap_us: int | None, wanted: set[int]) -> None:
        self.chain, self.v, self.gap_us, self.wanted = chain, v, gap_us, wanted
        self.rng = CompactRange()
        self.roots: dict[int, bytes] = {}
        self.hashes_at: dict[int, bytes] = {}
        self.expected = 0
        self.offset = 0
        self.prev = bytes.fromhex(GENESIS_PREV)  # recomputed hash of the previous row
        self.prev_stored = self.prev  # its stored hash
        self.prev2 = self.prev  # recomputed hash of the row before that
        self.prev_seq: int | None = None  # body seq of the previous row
        self.prev_altered = False
        self.link_known = True
        self.prev_ts: int | None = None
        self.last_type: str | None = None

    def err(self, code: str, seq: int, msg: str) -> None:
        self.v.add("error", code, self.chain, seq, msg)

    def feed(self, rec: Record) -> None:
        pos = rec.seq
        if not isinstance(pos, int) or isinstance(pos, bool):  # an edit in the store
            self.err("column_mismatch", self.expected,
                     f"stored column seq={pos!r} is not a sequence number: edited outside the "
                     "hash")
            pos = self.expected
        if pos != self.expected:
            self.err(
                "missing_records",
                self.expected,
                f"records {self.expected}..{pos - 1} missing (next stored record is {pos})",
            )
            self.link_known = False
        h = record_hash(rec.body)
        altered = h != rec.hash
        if altered:
            self.err("hash_mismatch", pos, "record content does not match its stored hash")
        obj: dict[str, Any] | None
        try:
            obj = parse_body(rec.body)
            if canonical_json(obj) != rec.body:
                self.err("non_canonical", pos, "record is not canonical JSON")
        except AuditFormatError as exc:
            self.err("malformed_record", pos, str(exc))
            obj = None
        if obj is not None:
            self._check_obj(obj, pos)
            self._check_columns(rec, obj, pos)
        self.prev2, self.prev, self.prev_stored = self.prev, h, rec.hash
        self.prev_altered = altered
        self.expected = pos + 1
        self.rng.append(h)
        if self.rng.size in self.wanted:
            self.roots[self.rng.size] = self.rng.root()
            self.hashes_at[self.rng.size] = h

    def _check_columns(self, rec: Record, obj: dict[str, Any], pos: int) -> None:
        """The stored columns outside the hash must repeat the hashed body.

        ``prove`` / ``find_request`` select by ``request_id``, ``tail`` and ``export`` by
        ``ts_us`` and ``type``: an edited column would hide or misattribute a record.
        """
        data = obj.get("data")
        rid = data.get("request_id") if isinstance(data, dict) else None
        expected = {
            "ts_us": obj.get("ts_us"),
            "type": obj.get("type"),
            "request_id": rid if isinstance(rid, str) else None,
        }
        stored = {"ts_us": rec.ts_us, "type": rec.type, "request_id": rec.request_id}
        for name, want in expected.items():
            if stored[name] != want:
                self.err(
                    "column_mismatch",
                    pos,
                    f"stored column {name}={stored[name]!r} differs from the hashed record "
                    f"({want!r}): edited outside the hash",
                )

    def _check_obj(self, obj: dict[str, Any], pos: int) -> None:
        if obj["chain"] != self.chain:
            self.err("wrong_chain", pos, f"record claims chain {obj['chain']}")
        seq = obj["seq"]
        misplaced = seq != pos
        if misplaced and seq - pos != self.offset:
            self.err("out_of_order", pos, f"record at position {pos} carries seq {seq}")
        self.offset = seq - pos
        prev = obj["prev"]
        if prev != self.prev.hex() and self.link_known:
            if seq == self.prev_seq and prev == self.prev2.hex():
                self.err(
                    "inserted_record",
                    pos - 1,
                    f"record at position {pos - 1} duplicates seq {seq} and is not linked "
                    "from its successor (inserted)",
                )
            elif not (self.prev_altered and prev == self.prev_stored.hex()) and not misplaced:
                self.err(
                    "broken_link",
                    pos,
                    f"prev does not match the hash of record {pos - 1} (one was altered)",
                )
        self.link_known = True
        if pos == 0 and obj["type"] != CHAIN_STARTED:
            self.err("missing_start", 0, "chain does not begin with chain.started")
        ts = obj["ts_us"]
        if self.prev_ts is not None and self.gap_us is not None and ts - self.prev_ts > self.gap_us:
            self.err(
                "time_gap",
                pos,
                f"{(ts - self.prev_ts) / 1e6:.1f} s since the previous record exceeds the "
                f"{self.gap_us / 1e6:.1f} s heartbeat bound (records deleted or writer "
                "stalled)",
            )
        self.prev_ts = ts
        self.prev_seq = seq
        self.last_type = obj["type"]


def _check_unlinked(
    chains: Sequence[ChainInfo], plans: dict[str, _ChainPlan], v: _Verifier
) -> None:
    """A chain that is not its replica's first must name a predecessor in ``chain.started``.

    Chains are ordered by the UTC start stamp in their id (inside every hashed record); the
    unhashed ``audit_chains.started_us`` only breaks ties within one second.
    """
    by_replica: dict[str, list[tuple[str, int, str]]] = {}
    for c in chains:
        start = plans[c.chain].start
        if start is None:
            continue  # missing_start / malformed_record are reported by the scan
        stamp = c.chain.split("/", 1)[-1].split("-", 1)[0]
        by_replica.setdefault(replica_of(c.chain), []).append((stamp, c.started_us, c.chain))
    for ordered in by_replica.values():
        ordered.sort()
        for (_, _, earlier), (_, _, chain) in itertools.pairwise(ordered):
            start = plans[chain].start or {}
            if start.get("previous_chain") is None:
                v.add(
                    "error",
                    "previous_chain_unlinked",
                    chain,
                    0,
                    f"chain.started names no previous chain, but {earlier} of the same replica "
                    "started before it (restart link broken: store edited, or two gateways "
                    "share a replica_id)",
                )


def _claimed_size(notes: Sequence[tuple[str, str, int]]) -> int:
    """Largest size any stored or exported checkpoint note claims, valid or not (0: none)."""
    claimed = 0
    for _, note, _ in notes:
        with contextlib.suppress(AuditFormatError):
            claimed = max(claimed, parse_checkpoint_unverified(note).size)
    return claimed


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
        # The stored time is not signed (the note is): one edited into a non-number is unknown.
        checkpoints.append((source, cp, ts_us if isinstance(ts_us, int) else -1))
    wanted = {cp.size for _, cp, _ in checkpoints}
    if plan.required_tail:
        wanted.add(plan.required_tail[0])
    gap_us = None
    if max_gap_s is not None:
        gap_us = int(max_gap_s * 1_000_000)
    elif plan.start and isinstance(plan.start.get("heartbeat_ms"), int):
        gap_us = (2 * plan.start["heartbeat_ms"] + 1000) * 1000
    scan = _Scan(chain, v, gap_us, wanted)
    pos = 0
    while True:
        page = await store.read_records(chain, pos, _PAGE)
        for rec in page:
            scan.feed(rec)
            pos = scan.expected
        if len(page) < _PAGE:
            break
    size = scan.rng.size
    summary.records = size
    summary.closed = scan.last_type == CHAIN_CLOSED
    good = sorted(
        cp.size
        for _, cp, _ in checkpoints
        if cp.size <= size and scan.roots.get(cp.size) == cp.root
    )
    last_size, sealed = -1, 0
    for source, cp, ts_us in sorted(checkpoints, key=lambda x: (x[2] < 0, x[2])):
        summary.checkpoints += 1
        exported = not source.startswith("store")
        if cp.size > size:
            v.add(
                "error",
                "rollback" if exported else "truncated",
                chain,
                size,
                f"checkpoint ({source}) seals {cp.size} records but the store holds {size}: "
                f"records {size}..{cp.size - 1} deleted or the store was restored from a copy",
            )
            continue
        if cp.size and scan.roots.get(cp.size) != cp.root:
            lo = max([g for g in good if g < cp.size], default=0)
            v.add(
                "error",
                "rollback" if exported else "checkpoint_mismatch",
                chain,
                lo,
                f"checkpoint ({source}) of size {cp.size} does not match the stored records: "
                f"records {lo}..{cp.size - 1} were altered, inserted or removed",
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
        elif scan.hashes_at.get(t_size, b"").hex() != t_hash:
            v.add(
                "error",
                "previous_chain_truncated",
                chain,
                t_size - 1,
                f"record {t_size - 1} differs from the tail hash recorded by {by}",
            )
    if size > sealed and summary.closed and _claimed_size(plan.notes) < size:
        # A clean close signs a final checkpoint over chain.closed in the same transaction;
        # none (not even a forged or mismatched one, reported above) claims to cover it.
        v.add(
            "error",
            "missing_checkpoint",
            chain,
            sealed,
            f"chain is closed but records {sealed}..{size - 1} are not covered by a signed "
            "checkpoint (its checkpoints were deleted or replaced)",
        )
    elif size > sealed:
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
