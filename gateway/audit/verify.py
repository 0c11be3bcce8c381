"""Offline verification of an audit store.

The report and its findings are in :mod:`gateway.audit.verify_report`, the per-record checks
of one chain in :mod:`gateway.audit.verify_scan`; here, the store as a whole: which chains,
checkpoints and links must agree, and the checkpoints against what the scan recomputed.

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
* every chain id has the form a writer gives it (``malformed_chain_id``);
* some record of every chain is covered by a valid checkpoint, signed by a trusted key when
  keys are given (``unauthenticated_chain``): a writer seals ``chain.started`` as it starts;
* records after the newest valid checkpoint are reported as ``unsealed`` (warning) when a live
  or crashed writer could have left them (fewer than its ``checkpoint_every_records``, within
  ``2 x checkpoint_every_s + heartbeat_s``, none after the tail its successor recorded), else
  as ``unsealed_overdue`` (error), or as ``missing_checkpoint`` (error) when the chain is
  closed: a clean close always signs a final checkpoint. ``allow_unsealed`` names the chains
  for which the first two are warnings;
* the stored columns outside the hash (``ts_us``, ``type``, ``request_id``), by which ``prove``,
  ``tail`` and ``export`` select records, repeat the hashed body (``column_mismatch``);
* with a checkpoint directory, every exported checkpoint must be matched by the store: a
  store holding fewer records, or other records, than an exported checkpoint was rolled back
  or forked (``rollback``).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.audit.chains import boot_stamp, is_chain_id
from gateway.audit.checkpoint import Checkpoint, Verifier, parse_checkpoint_unverified
from gateway.audit.checkpoint_dir import load_checkpoint_dir
from gateway.audit.errors import AuditFormatError
from gateway.audit.records import CHAIN_CLOSED, CHAIN_STARTED, parse_body
from gateway.audit.store import ChainInfo, Store, replica_of
from gateway.audit.verify_report import ChainSummary, Findings, Severity, VerifyReport
from gateway.audit.verify_scan import ChainScan

_PAGE = 5000


@dataclass
class _ChainPlan:
    """What must be checked for one chain, collected before reading its records."""

    chain: str
    start: dict[str, Any] | None = None
    notes: list[tuple[str, str, int]] = field(default_factory=list)  # (source, note, ts_us)
    required_tail: tuple[int, str, str] | None = None  # (size, hash hex, named by chain)
    allow_unsealed: bool = False  # named by --allow-unsealed: no trusted checkpoint is a warning


async def verify_store(
    store: Store,
    *,
    verifiers: Sequence[Verifier] = (),
    checkpoint_dir: Path | None = None,
    max_gap_s: float | None = None,
    allow_unsealed: Collection[str] = (),
) -> VerifyReport:
    """Verify every chain of an (open) store; see the module docstring for the checks.

    Args:
        store: An opened store.
        verifiers: Trusted checkpoint keys; without any, signatures are not checked (warning).
        checkpoint_dir: Directory of exported checkpoints (rollback detection).
        max_gap_s: Largest allowed time between consecutive records of a chain, seconds;
            default ``2 * heartbeat + 1`` from each chain's start record.
        allow_unsealed: Chain ids accepted without a trusted checkpoint (their records are
            not authenticated): ``unauthenticated_chain`` and ``unsealed_overdue`` become
            warnings for these chains only.

    Returns:
        The report (``report.ok`` is False if anything was tampered with or lost).

    Raises:
        AuditUnavailable: If the store cannot be read.
        AuditConfigError: If the checkpoint directory cannot be read.
    """
    report = VerifyReport(store.display_url, signatures_checked=bool(verifiers))
    v = Findings(report, verifiers)
    if not verifiers:
        v.add("warning", "signatures_not_checked", None, None, "no public key given")
    chains = await store.list_chains()
    plans = {c.chain: _ChainPlan(c.chain, allow_unsealed=c.chain in allow_unsealed)
             for c in chains}
    for c in chains:
        if not is_chain_id(c.chain):
            v.add("error", "malformed_chain_id", c.chain, None,
                  "chain id is not <replica>/<YYYYmmddTHHMMSSZ>-<8 hex digits> (the store was "
                  "edited, or not written by a gateway)")
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
        for path, note in load_checkpoint_dir(checkpoint_dir):
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


def _check_unlinked(
    chains: Sequence[ChainInfo], plans: dict[str, _ChainPlan], v: Findings
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
        stamp = boot_stamp(c.chain)
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
    store: Store, plan: _ChainPlan, v: Findings, max_gap_s: float | None
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
    scan = ChainScan(chain, v, gap_us, wanted)
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
    linked = 0  # records of this chain its successor's chain.started names (size + hash)
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
        else:
            linked = t_size
    if size and not sealed:
        _unauthenticated(plan, v, size)
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
    elif size > max(sealed, linked) and sealed and not summary.closed:
        _check_unsealed_tail(plan, v, scan, size, sealed, linked)
    elif size > sealed and sealed:  # closed: its checkpoints' errors are reported above
        v.add("warning", "unsealed", chain, sealed,
              f"records {sealed}..{size - 1} are not covered by a signed checkpoint")
    if not summary.closed:
        v.add(
            "warning",
            "not_closed",
            chain,
            None,
            "chain has no chain.closed record (writer still running, or it crashed)",
        )
    return summary


def _unauthenticated(plan: _ChainPlan, v: Findings, size: int) -> None:
    """No record of the chain is covered by a valid (trusted, when keys are given) checkpoint.

    A writer signs a checkpoint over ``chain.started`` in the transaction that creates the
    chain, so a chain without one was not written by a gateway holding a trusted key (records
    inserted with valid hash links by anyone who can write to the store), or its checkpoints
    were deleted. Its records prove nothing: an error, unless named by ``--allow-unsealed``.
    """
    signed = "signed by a trusted key" if v.verifiers else "that verifies"
    if plan.allow_unsealed:
        sev: Severity = "warning"
        what = "accepted as unauthenticated by --allow-unsealed"
        v.report.accepted_unsealed.append(plan.chain)
    else:
        sev, what = "error", "pass --allow-unsealed CHAIN to accept it as unauthenticated"
    v.add(sev, "unauthenticated_chain", plan.chain, 0,
          f"none of its {size} records is covered by a checkpoint {signed}; a gateway seals "
          "chain.started when it starts, so this chain was not written by a trusted gateway or "
          f"its checkpoints were deleted ({what})")


def _check_unsealed_tail(
    plan: _ChainPlan, v: Findings, scan: ChainScan, size: int, sealed: int, linked: int
) -> None:
    """Records after the newest valid checkpoint (and after the tail a successor named).

    A live or crashed writer leaves fewer than ``checkpoint_every_records`` of them, written
    within ``2 x checkpoint_every_s + heartbeat_s`` of the last sealed record (settings from
    its sealed ``chain.started``): such a tail is a warning (``unsealed``). A longer or later
    one, or one after the tail the chain's successor recorded when it started, was not written
    by that writer: ``unsealed_overdue`` (an error unless named by ``--allow-unsealed``).
    """
    start = plan.start or {}
    problems: list[str] = []
    if plan.required_tail and linked:
        problems.append(f"they follow the {linked} records {plan.required_tail[2]} recorded "
                        "when it started as this chain's successor")
    every = start.get("checkpoint_every_records")
    if isinstance(every, int) and every > 0 and size - sealed >= every:
        problems.append(f"{size - sealed} records, but the writer signs a checkpoint every "
                        f"{every} records")
    cp_ms, hb_ms = start.get("checkpoint_every_ms"), start.get("heartbeat_ms")
    t0, t1 = scan.ts_at.get(sealed), scan.prev_ts
    if isinstance(cp_ms, int) and isinstance(hb_ms, int) and t0 is not None and t1 is not None:
        bound_us = (2 * cp_ms + hb_ms) * 1000
        if t1 - t0 > bound_us:
            problems.append(f"written up to {(t1 - t0) / 1e6:.1f} s after the last sealed record, "
                            f"but the writer signs within {bound_us / 1e6:.1f} s (2 x "
                            "checkpoint_every_s + heartbeat_s)")
    lo = max(sealed, linked)
    where = f"records {lo}..{size - 1} are not covered by a signed checkpoint"
    if not problems:
        v.add("warning", "unsealed", plan.chain, lo, where)
    elif plan.allow_unsealed:
        v.report.accepted_unsealed.append(plan.chain)
        v.add("warning", "unsealed", plan.chain, lo,
              f"{where}: {'; '.join(problems)} (accepted by --allow-unsealed)")
    else:
        v.add("error", "unsealed_overdue", plan.chain, lo,
              f"{where}: {'; '.join(problems)}; no writer leaves such a tail (records appended "
              "to the store by hand, or its checkpoints deleted)")
