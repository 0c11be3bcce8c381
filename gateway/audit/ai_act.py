"""AI Act log export: a period's records, each event mapped to Art. 12(2), with completeness proofs.

``gateway audit export --format ai-act`` writes one JSON document (schema
:data:`EXPORT_SCHEMA`)::

    {"schema": "sovereign-gateway/ai-act-log/v1", "generated_at": RFC 3339,
     "period": {"since": RFC 3339 | null, "until": RFC 3339 | null},
     "field_map": [{"field", "record", "art_12_2", "iso_iec_dis_24970"}, ...],
     "events": [{"event_id", "timestamp", "event_type", "fields": {...}, "record": text}],
     "completeness": [{"chain", "first_seq", "last_seq", "count", "unsealed_excluded",
                       "first", "last", "before", "after"}]}

Each event keeps the canonical record text (``record``), so its hash, its chain link (``prev``)
and the mapped ``fields`` (recomputed by :func:`verify_export`) can be checked. Completeness,
per chain: the period's sealed records are ``first_seq..last_seq`` without gap, each naming the
previous one's hash; ``first`` and ``last`` are inclusion proofs (format of
:mod:`gateway.audit.proof`) against a signed checkpoint; ``before`` (record ``first_seq - 1``,
older than ``since``) and ``after`` (record ``last_seq + 1``, not older than ``until``) prove
that nothing of the period lies outside the range; without ``after`` the range must end with
the chain's ``chain.closed`` record (a checkpoint carries no time: an older one would hide a cut
tail), and every event must lie in the period. Records after a chain's newest checkpoint
are not sealed yet: they are left out and counted in ``unsealed_excluded``. A chain is found by
its records in the period; a chain whose records were all deleted cannot be seen here (the
pre-flight's ``audit.retention`` and ``gateway audit verify`` look for that).

Field mapping: Art. 12(2) of Regulation (EU) 2024/1689 names three purposes of the logs:
(a) identifying situations that may result in a risk (Art. 79(1)) or a substantial
modification, (b) post-market monitoring (Art. 72), (c) monitoring of the operation by the
deployer (Art. 26(5)). ISO/IEC DIS 24970 (AI system logging) is a **draft** International
Standard, not yet published; the event-field names in :data:`FIELD_MAP` follow our reading of
its public summaries (clause 7 triggers, clause 8 information to log) and are ours, not the
draft's text.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.audit.checkpoint import Verifier
from gateway.audit.errors import AuditError, AuditFormatError, NotSealedError, ProofError
from gateway.audit.proof import PROOF_FORMAT, prove_record, verify_proof
from gateway.audit.query import export_records
from gateway.audit.records import Record, parse_body, record_hash
from gateway.audit.store import Store

__all__ = ["EXPORT_SCHEMA", "FIELD_MAP", "export_ai_act", "verify_export"]

EXPORT_SCHEMA = "sovereign-gateway/ai-act-log/v1"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: Export field -> where it comes from in the record, the Art. 12(2) purposes it serves and
#: the ISO/IEC DIS 24970 (draft) event-information category it corresponds to (our reading).
FIELD_MAP: tuple[dict[str, str], ...] = (
    {"field": "event_id", "record": "chain + '#' + seq", "art_12_2": "a, b, c",
     "iso_iec_dis_24970": "event identifier"},
    {"field": "timestamp", "record": "ts_us (RFC 3339, UTC, microseconds)", "art_12_2": "a, b, c",
     "iso_iec_dis_24970": "date and time of the event"},
    {"field": "event_type", "record": "type", "art_12_2": "a, b, c",
     "iso_iec_dis_24970": "event type / logging trigger"},
    {"field": "system_instance", "record": "chain (replica and process start)",
     "art_12_2": "b, c", "iso_iec_dis_24970": "AI system (component) identification"},
    {"field": "config_sha256", "record": "data.sha256 of config.loaded", "art_12_2": "a",
     "iso_iec_dis_24970": "system configuration / version change"},
    {"field": "request_id", "record": "data.request_id", "art_12_2": "a, b, c",
     "iso_iec_dis_24970": "operation (session) identifier"},
    {"field": "user_key_id", "record": "data.key_id (API key id, never the key)",
     "art_12_2": "c", "iso_iec_dis_24970": "user / operator identification"},
    {"field": "team", "record": "data.team", "art_12_2": "c",
     "iso_iec_dis_24970": "user / operator identification"},
    {"field": "data_class", "record": "data.data_class", "art_12_2": "a, c",
     "iso_iec_dis_24970": "input data characteristics"},
    {"field": "model_requested", "record": "data.model", "art_12_2": "b, c",
     "iso_iec_dis_24970": "AI model identification"},
    {"field": "model_served", "record": "data.served_model", "art_12_2": "a, b, c",
     "iso_iec_dis_24970": "AI model identification and version"},
    {"field": "input_reference", "record": "data.request_content_hmac (keyed digest, never "
     "the prompt)", "art_12_2": "a, b", "iso_iec_dis_24970": "input data reference"},
    {"field": "destination", "record": "data.destination, data.region", "art_12_2": "a, c",
     "iso_iec_dis_24970": "processing location / external resource"},
    {"field": "decision", "record": "data.decision, data.policy_rule, data.policy_revision",
     "art_12_2": "a, c", "iso_iec_dis_24970": "decision and the rule applied"},
    {"field": "outcome", "record": "data.status, data.outcome, data.error_code",
     "art_12_2": "a, b, c", "iso_iec_dis_24970": "output / result status, errors"},
    {"field": "usage", "record": "data.input_tokens, data.output_tokens", "art_12_2": "b",
     "iso_iec_dis_24970": "output characteristics"},
    {"field": "latency_us", "record": "data.latency_us, data.ttft_us", "art_12_2": "a, b",
     "iso_iec_dis_24970": "performance information"},
)

_DATA_FIELDS: dict[str, tuple[str, ...]] = {
    "config_sha256": ("sha256",), "request_id": ("request_id",), "user_key_id": ("key_id",),
    "team": ("team",), "data_class": ("data_class",), "model_requested": ("model",),
    "model_served": ("served_model",), "input_reference": ("request_content_hmac",),
    "destination": ("destination", "region"),
    "decision": ("decision", "policy_rule", "policy_revision"),
    "outcome": ("status", "outcome", "error_code"), "usage": ("input_tokens", "output_tokens"),
    "latency_us": ("latency_us", "ttft_us"),
}


def _rfc3339(ts_us: int) -> str:
    when = _EPOCH + timedelta(microseconds=ts_us)  # exact: no float seconds
    return when.isoformat(timespec="microseconds").replace("+00:00", "Z")


def event_of(body: bytes) -> dict[str, Any]:
    """The export event of one canonical record (the mapping of :data:`FIELD_MAP`).

    Raises:
        AuditFormatError: ``body`` is not a record.
    """
    obj = parse_body(body)
    data = obj["data"]
    fields: dict[str, Any] = {"system_instance": obj["chain"]}
    for name, keys in _DATA_FIELDS.items():
        present = {k: data[k] for k in keys if data.get(k) is not None}
        if present:
            fields[name] = present[keys[0]] if len(keys) == 1 and keys[0] in present \
                else present
    return {"event_id": f"{obj['chain']}#{obj['seq']}", "timestamp": _rfc3339(obj["ts_us"]),
            "event_type": obj["type"], "fields": fields, "record": body.decode("utf-8")}


async def _proof(store: Store, chain: str, seq: int) -> dict[str, Any] | None:
    recs = await store.read_records(chain, seq, 1)
    if not recs or recs[0].seq != seq:
        return None
    return await prove_record(store, recs[0])


async def export_ai_act(store: Store, since_us: int | None, until_us: int | None,
                        now_us: int) -> dict[str, Any]:
    """Build the export of the records with ``since_us <= ts_us < until_us``.

    Args:
        store: An opened store.
        since_us: Inclusive start, microseconds since the epoch (None: from the beginning).
        until_us: Exclusive end (None: up to the newest sealed record).
        now_us: Time of the export.

    Raises:
        AuditError: The store has a gap in a chain, or does not match its checkpoints (run
            ``gateway audit verify``).
        AuditUnavailable: The store cannot be read.
    """
    by_chain: dict[str, list[Record]] = {}
    async for rec in export_records(store, since_us, until_us):
        by_chain.setdefault(rec.chain, []).append(rec)
    events, completeness = [], []
    for chain, recs in by_chain.items():
        recs.sort(key=lambda r: r.seq)
        cps = await store.checkpoints(chain)
        sealed_size = max((c.size for c in cps), default=0)
        sealed = [r for r in recs if r.seq < sealed_size]
        entry: dict[str, Any] = {"chain": chain, "count": len(sealed),
                                 "unsealed_excluded": len(recs) - len(sealed)}
        if sealed:
            first, last = sealed[0].seq, sealed[-1].seq
            if last - first + 1 != len(sealed):
                raise AuditError(f"chain {chain} has a gap between seq {first} and {last}; "
                                 "run gateway audit verify")
            try:
                entry.update(
                    first_seq=first, last_seq=last,
                    first=await prove_record(store, sealed[0]),
                    last=await prove_record(store, sealed[-1]),
                    before=await _proof(store, chain, first - 1) if first > 0 else None,
                    after=(await _proof(store, chain, last + 1)
                           if last + 1 < sealed_size else None))
            except NotSealedError as exc:  # a checkpoint vanished between two reads
                raise AuditError(f"chain {chain}: {exc}") from exc
            events += [event_of(r.body) for r in sealed]
        completeness.append(entry)
    events.sort(key=lambda e: (e["timestamp"], e["event_id"]))
    return {
        "schema": EXPORT_SCHEMA, "generated_at": _rfc3339(now_us),
        "period": {"since": None if since_us is None else _rfc3339(since_us),
                   "until": None if until_us is None else _rfc3339(until_us)},
        "field_map": [dict(f) for f in FIELD_MAP],
        "events": events, "completeness": completeness,
    }


def _us(text: str | None) -> int | None:
    if text is None:
        return None
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (dt - _EPOCH) // timedelta(microseconds=1)


def _proved(entry: Any, verifiers: Sequence[Verifier], what: str) -> dict[str, Any]:
    if not isinstance(entry, Mapping):
        raise AuditFormatError(f"{what}: missing inclusion proof")
    try:
        return verify_proof({"format": PROOF_FORMAT, "entries": [entry]}, verifiers)[0]
    except ProofError as exc:
        raise ProofError(f"{what}: {exc}") from exc


def verify_export(doc: Mapping[str, Any], verifiers: Sequence[Verifier]) -> int:
    """Check an export offline with the audit verifier key(s) alone.

    Returns:
        The number of events verified.

    Raises:
        AuditFormatError: Not an export, a malformed entry, or fields that do not repeat the
            record.
        ProofError: A checkpoint signature or inclusion proof fails, a record is missing from
            a chain's range, or a boundary record lies inside the period.
    """
    if doc.get("schema") != EXPORT_SCHEMA:
        raise AuditFormatError(f"not a {EXPORT_SCHEMA} document")
    period = doc.get("period") or {}
    since, until = _us(period.get("since")), _us(period.get("until"))
    by_chain: dict[str, list[dict[str, Any]]] = {}
    for i, event in enumerate(doc.get("events") or ()):
        body = str(event.get("record", "")).encode("utf-8")
        if event_of(body) != dict(event):
            raise AuditFormatError(f"event {i}: its fields do not repeat its record")
        obj = parse_body(body)
        by_chain.setdefault(obj["chain"], []).append(obj | {"_hash": record_hash(body)})
    seen = set()
    for entry in doc.get("completeness") or ():
        chain = str(entry.get("chain"))
        seen.add(chain)
        objs = sorted(by_chain.get(chain, []), key=lambda o: o["seq"])
        try:
            count = int(entry.get("count") or 0)
            first, last = ((int(entry["first_seq"]), int(entry["last_seq"])) if count or objs
                           else (0, -1))
        except (KeyError, TypeError, ValueError) as exc:
            raise AuditFormatError(f"chain {chain}: malformed completeness entry: {exc}") \
                from exc
        if count != len(objs):
            raise ProofError(f"chain {chain}: records {first}..{last} are not all exported "
                             f"(count {count}, {len(objs)} exported)")
        if not objs:
            continue
        if [o["seq"] for o in objs] != list(range(first, last + 1)):
            raise ProofError(f"chain {chain}: records {first}..{last} are not all exported")
        for o in objs:
            if (since is not None and o["ts_us"] < since) or \
                    (until is not None and o["ts_us"] >= until):
                raise ProofError(f"chain {chain} seq {o['seq']}: outside the period")
        for prev, cur in itertools.pairwise(objs):
            if cur["prev"] != prev["_hash"].hex():
                raise ProofError(f"chain {chain} seq {cur['seq']}: prev is not the hash of "
                                 f"seq {prev['seq']}")
        for name, obj in (("first", objs[0]), ("last", objs[-1])):
            got = _proved(entry.get(name), verifiers, f"chain {chain} {name}")
            if got["seq"] != obj["seq"] or got["ts_us"] != obj["ts_us"] or \
                    record_hash(str(entry[name]["record"]).encode()) != obj["_hash"]:
                raise ProofError(f"chain {chain}: the {name} proof is for another record")
        if first > 0:
            if since is None:  # the period starts at the beginning: records 0.. belong to it
                raise ProofError(f"chain {chain}: records 0..{first - 1} are missing from an "
                                 "export from the beginning")
            before = _proved(entry.get("before"), verifiers, f"chain {chain} before")
            if before["seq"] != first - 1 or before["ts_us"] >= since:
                raise ProofError(f"chain {chain}: record {before['seq']} before the range "
                                 "belongs to the period")
        if entry.get("after") is not None:
            after = _proved(entry["after"], verifiers, f"chain {chain} after")
            if after["seq"] != last + 1 or (until is None or after["ts_us"] < until):
                raise ProofError(f"chain {chain}: record {after['seq']} after the range "
                                 "belongs to the period")
        elif objs[-1]["type"] != "chain.closed":
            # A signed checkpoint carries no time: one of size last + 1 only shows the chain
            # had no more records when it was signed. Without a record after the range, only
            # the chain's own closing record proves that nothing follows.
            raise ProofError(f"chain {chain}: no proof that record {last + 1} is outside "
                             "the period (the chain has not ended: export again once a "
                             "record after the period is sealed)")
    if set(by_chain) - seen:
        raise ProofError(f"chains without completeness proof: {sorted(set(by_chain) - seen)}")
    return sum(len(v) for v in by_chain.values())

