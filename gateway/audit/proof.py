"""Inclusion proofs a third party can check with the public key alone.

A proof bundle (JSON, format ``sovereign-gateway/audit-proof/v1``)::

    {"format": "sovereign-gateway/audit-proof/v1", "request_id": "...",
     "entries": [{"record": "<canonical JSON text>", "index": <seq>, "tree_size": <n>,
                  "proof": ["<base64 hash>", ...], "checkpoint": "<signed note>"}]}

To check an entry: verify the checkpoint note with the verifier key (c2sp.org/signed-note),
compute the leaf hash ``SHA-256(0x00 || record bytes)``, and run the RFC 9162 2.1.3.2
inclusion check of that leaf at ``index`` against the checkpoint root. The record must name the
checkpoint's origin as its chain and ``index`` as its sequence number.

Completeness: each entry proves only that its record is in the log, not that the bundle holds
every record of the request. A forwarded request has a ``request.started`` and a
``request.completed`` record (a refused one a single ``request.denied``); a bundle with one of
the pair alone still verifies, so :func:`verify_proof_report` lists the record types proved and
warns about the missing half (recomputed from the verified records, never taken from the
bundle). :func:`prove` adds the same ``warnings`` list to the bundle when the log itself lacks a
record (request in flight, or the gateway crashed before writing the completion).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.audit.chains import is_chain_id
from gateway.audit.checkpoint import Verifier, open_checkpoint, parse_checkpoint_unverified
from gateway.audit.errors import (
    AuditError,
    AuditFormatError,
    NotSealedError,
    ProofError,
    RecordNotFound,
)
from gateway.audit.merkle import inclusion_proof, verify_inclusion
from gateway.audit.records import Record, parse_body, record_hash
from gateway.audit.store import Store

PROOF_FORMAT = "sovereign-gateway/audit-proof/v1"
REQUEST_STARTED = "request.started"
REQUEST_COMPLETED = "request.completed"


@dataclass
class ProofReport:
    """What a verified proof bundle shows.

    Attributes:
        records: the verified records (parsed JSON), in bundle order.
        types: their ``type`` values, in bundle order (e.g. ``["request.started"]``).
        warnings: completeness warnings (empty when the request's record set is whole).
    """

    records: list[dict[str, Any]]
    types: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def completeness_warnings(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Warn about requests whose ``request.started`` / ``request.completed`` pair is incomplete.

    Args:
        records: parsed records (``{"type": ..., "data": {"request_id": ...}}``), any order.

    Returns:
        One message per request id with a start and no completion, or the reverse.
    """
    seen: dict[str, set[str]] = {}
    for rec in records:
        data = rec.get("data")
        rid = data.get("request_id") if isinstance(data, Mapping) else None
        seen.setdefault(str(rid), set()).add(str(rec.get("type")))
    out = []
    for rid, types in seen.items():
        if REQUEST_STARTED in types and REQUEST_COMPLETED not in types:
            out.append(
                f"request {rid}: only {REQUEST_STARTED} is proven, there is no "
                f"{REQUEST_COMPLETED} record (removed from the bundle, request still in flight, "
                "or the gateway stopped before writing it): the outcome is not proven"
            )
        elif REQUEST_COMPLETED in types and REQUEST_STARTED not in types:
            out.append(
                f"request {rid}: {REQUEST_COMPLETED} is proven but there is no "
                f"{REQUEST_STARTED} record (removed from the bundle, or written by another "
                "chain): who asked and where it was routed are not proven"
            )
    return out


async def _leaves(store: Store, chain: str, size: int) -> list[bytes]:
    leaves: list[bytes] = []
    while len(leaves) < size:
        page = await store.read_records(chain, len(leaves), min(5000, size - len(leaves)))
        if not page:
            break
        for rec in page:
            if rec.seq != len(leaves):
                raise AuditError(f"chain {chain} has a gap at seq {len(leaves)}; run verify")
            leaves.append(record_hash(rec.body))
    return leaves


async def prove_record(store: Store, record: Record) -> dict[str, Any]:
    """Build the proof entry of one record against its chain's newest checkpoint.

    Raises:
        NotSealedError: If no checkpoint covers the record yet.
        AuditError: If the stored records do not match the checkpoint (run ``verify``).
    """
    cps = await store.checkpoints(record.chain)
    if not cps or cps[-1].size <= record.seq:
        raise NotSealedError(
            f"record {record.chain} seq {record.seq} is not sealed by a checkpoint yet; "
            "retry after the next checkpoint"
        )
    newest = max(cps, key=lambda c: c.size)
    cp = parse_checkpoint_unverified(newest.note)
    leaves = await _leaves(store, record.chain, newest.size)
    if len(leaves) != newest.size:
        raise AuditError(f"chain {record.chain} is shorter than its checkpoint; run verify")
    path = inclusion_proof(record.seq, leaves)
    try:
        verify_inclusion(record.seq, cp.size, leaves[record.seq], path, cp.root)
    except AuditError as exc:
        raise AuditError(f"store does not match checkpoint of {record.chain}: {exc}") from exc
    return {
        "record": record.body.decode("utf-8"),
        "index": record.seq,
        "tree_size": newest.size,
        "proof": [base64.b64encode(p).decode() for p in path],
        "checkpoint": newest.note,
    }


async def prove(store: Store, request_id: str) -> dict[str, Any]:
    """Return the proof bundle of every record of ``request_id`` (started, completed).

    The bundle carries ``warnings`` (see :func:`completeness_warnings`) when the log itself
    lacks half of the request's records; a verifier recomputes them and does not trust these.

    Raises:
        RecordNotFound: If no record carries that request id.
        NotSealedError: If a record is not yet covered by a checkpoint.
    """
    records = await store.find_request(request_id)
    if not records:
        raise RecordNotFound(f"no audit record with request_id {request_id!r}")
    entries = [await prove_record(store, rec) for rec in records]
    warnings = completeness_warnings([parse_body(rec.body) for rec in records])
    return {
        "format": PROOF_FORMAT,
        "request_id": request_id,
        "entries": entries,
        "warnings": warnings,
    }


def verify_proof_report(bundle: Mapping[str, Any], verifiers: Sequence[Verifier]) -> ProofReport:
    """Check a proof bundle like :func:`verify_proof` and report what it proves.

    Args:
        bundle: Parsed proof bundle JSON.
        verifiers: Trusted checkpoint keys.

    Returns:
        The verified records, their types and completeness warnings (recomputed here; a
        ``warnings`` field inside the bundle is ignored).

    Raises:
        AuditFormatError: If the bundle is malformed.
        ProofError: If a signature or an inclusion proof does not verify.
    """
    records = verify_proof(bundle, verifiers)
    return ProofReport(
        records=records,
        types=[str(r.get("type")) for r in records],
        warnings=completeness_warnings(records),
    )


def verify_proof(bundle: Mapping[str, Any], verifiers: Sequence[Verifier]) -> list[dict[str, Any]]:
    """Check a proof bundle offline with the public key(s) alone.

    Each record is checked on its own; use :func:`verify_proof_report` to also learn whether
    the request's record set is complete.

    Args:
        bundle: Parsed proof bundle JSON.
        verifiers: Trusted checkpoint keys.

    Returns:
        The verified records (parsed JSON), in bundle order.

    Raises:
        AuditFormatError: If the bundle is malformed.
        ProofError: If a signature or an inclusion proof does not verify.
    """
    if bundle.get("format") != PROOF_FORMAT or not isinstance(bundle.get("entries"), list):
        raise AuditFormatError(f"not a {PROOF_FORMAT} bundle")
    out = []
    for i, entry in enumerate(bundle["entries"]):
        try:
            body = str(entry["record"]).encode("utf-8")
            index = int(entry["index"])
            proof = [base64.b64decode(p, validate=True) for p in entry["proof"]]
            note = str(entry["checkpoint"])
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise AuditFormatError(f"proof entry {i} is malformed: {exc}") from exc
        cp = open_checkpoint(note, verifiers)
        obj = parse_body(body)
        for what, chain in (("record", obj["chain"]), ("checkpoint", cp.origin)):
            if not is_chain_id(chain):  # never echoed raw: it may hold CR or escapes
                raise AuditFormatError(f"proof entry {i}: the {what}'s chain id {chain!r} is "
                                       "not <replica>/<YYYYmmddTHHMMSSZ>-<8 hex digits>")
        if obj["chain"] != cp.origin or obj["seq"] != index:
            raise AuditFormatError(
                f"proof entry {i}: record is {obj['chain']} seq {obj['seq']}, "
                f"proof is for {cp.origin} index {index}"
            )
        if "request_id" in bundle and obj["data"].get("request_id") != bundle["request_id"]:
            raise AuditFormatError(f"proof entry {i} is for another request id")
        try:
            verify_inclusion(index, cp.size, record_hash(body), proof, cp.root)
        except ProofError as exc:  # name the record, as the format errors above do
            raise ProofError(f"proof entry {i} ({obj['chain']}#{index} {obj.get('type')}): "
                             f"{exc}") from exc
        out.append(obj)
    return out
