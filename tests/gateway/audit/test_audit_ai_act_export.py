"""`gateway audit export --format ai-act`: events mapped to Art. 12(2), completeness proven.

A real AuditLog writes a real SQLite store (three chains: a replica restarted twice); the
export runs through the CLI; :func:`verify_export` (and ``gateway audit verify-export``)
checks it with the public key alone, and refuses an export with a record left out, a field
changed, a boundary proof dropped or the wrong key.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gateway.audit import Signer, write_key_pair
from gateway.audit.ai_act import EXPORT_SCHEMA, FIELD_MAP, verify_export
from gateway.audit.errors import AuditFormatError, ProofError
from gateway.cli import main
from tests.gateway.audit._audit_helpers import raw_sql, write_log


def _iso(ts_us: int) -> str:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=ts_us)).isoformat()


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, Signer, Path]:
    signer = Signer.generate()
    _, pub = write_key_pair(signer, tmp_path / "audit.key")
    url = f"sqlite://{tmp_path / 'audit.db'}"
    for _ in range(3):
        write_log(url, signer, 23, checkpoint_every_records=5)
    return url, signer, pub


def _export(url: str, out: Path, capsys: pytest.CaptureFixture[str], *period: str) -> Any:
    code = main(["audit", "export", "--store", url, "--format", "ai-act", "--out", str(out),
                 *period])
    assert code == 0, capsys.readouterr()
    return json.loads(out.read_text())


def test_whole_log_exports_and_verifies(store: tuple[str, Signer, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    url, signer, pub = store
    doc = _export(url, tmp_path / "all.json", capsys)
    assert doc["schema"] == EXPORT_SCHEMA
    stored = raw_sql(url, "SELECT count(*) FROM audit_records")[0][0]
    assert len(doc["events"]) == stored == 3 * (23 + 2)  # + chain.started, chain.closed
    assert [c["first_seq"] for c in doc["completeness"]] == [0, 0, 0]
    assert verify_export(doc, [signer.verifier]) == stored
    started = next(e for e in doc["events"] if e["event_type"] == "request.started")
    assert started["fields"]["request_id"].startswith("req-")
    assert {f["field"] for f in FIELD_MAP} >= set(started) - {"fields", "record"}
    capsys.readouterr()
    assert main(["audit", "verify-export", str(tmp_path / "all.json"), "--public-key",
                 str(pub)]) == 0
    assert f"OK: {stored} events" in capsys.readouterr().out


def test_period_in_the_middle_is_bounded_by_proofs(
        store: tuple[str, Signer, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    url, signer, _ = store
    rows = raw_sql(url, "SELECT ts_us FROM audit_records ORDER BY ts_us, id")
    since, until = rows[10][0], rows[60][0]
    doc = _export(url, tmp_path / "mid.json", capsys, "--since", _iso(since),
                  "--until", _iso(until))
    want = sum(1 for (ts,) in rows if since <= ts < until)
    assert len(doc["events"]) == want > 0
    key = [signer.verifier]
    assert verify_export(doc, key) == want
    inner = [c for c in doc["completeness"] if c["first_seq"] > 0]
    assert inner and all(c["before"] is not None for c in inner)

    # a record left out of the middle of a chain's range
    gap = copy.deepcopy(doc)
    chain_events = [i for i, e in enumerate(gap["events"])
                    if e["event_id"].startswith(inner[0]["chain"] + "#")]
    del gap["events"][chain_events[len(chain_events) // 2]]
    with pytest.raises(ProofError, match="not all exported"):
        verify_export(gap, key)
    # the last record of the range dropped together with its proof entry: 'after' no longer
    # follows the range
    cut = copy.deepcopy(doc)
    entry = next(c for c in cut["completeness"] if c["after"] is not None)
    last = f"{entry['chain']}#{entry['last_seq']}"
    cut["events"] = [e for e in cut["events"] if e["event_id"] != last]
    entry["last_seq"] -= 1
    with pytest.raises(ProofError):
        verify_export(cut, key)
    # a mapped field that no longer repeats its record
    edited = copy.deepcopy(doc)
    edited["events"][0]["fields"]["system_instance"] = "elsewhere"
    with pytest.raises(AuditFormatError, match="do not repeat"):
        verify_export(edited, key)
    # the 'before' proof removed: nothing shows the range starts at the period's start
    nobefore = copy.deepcopy(doc)
    next(c for c in nobefore["completeness"] if c["first_seq"] > 0)["before"] = None
    with pytest.raises(AuditFormatError, match="missing inclusion proof"):
        verify_export(nobefore, key)
    # another key
    with pytest.raises((ProofError, AuditFormatError)):
        verify_export(doc, [Signer.generate().verifier])


def test_verify_export_cli_exits_1_on_a_missing_record(
        store: tuple[str, Signer, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    url, _, pub = store
    path = tmp_path / "all.json"
    doc = _export(url, path, capsys)
    del doc["events"][5]
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["audit", "verify-export", str(path), "--public-key", str(pub)]) == 1
    assert "FAILED" in capsys.readouterr().err


def _older_checkpoint_proof(url: str, chain: str, below: int) -> dict[str, Any]:
    """The attacker's forged tail: an inclusion proof of record ``size - 1`` against an older
    signed checkpoint of ``chain`` (public data: every checkpoint note is stored)."""
    import base64

    from gateway.audit.merkle import inclusion_proof
    from gateway.audit.records import record_hash

    size, note = next((s, n) for s, n in sorted(raw_sql(
        url, "SELECT size, note FROM audit_checkpoints WHERE chain = ?", chain),
        reverse=True) if s < below)
    bodies = [bytes(b) if not isinstance(b, str) else b.encode() for (b,) in raw_sql(
        url, "SELECT body FROM audit_records WHERE chain = ? ORDER BY seq", chain)][:size]
    path = inclusion_proof(size - 1, [record_hash(b) for b in bodies])
    return {"record": bodies[-1].decode(), "index": size - 1, "tree_size": size,
            "proof": [base64.b64encode(p).decode() for p in path], "checkpoint": note}


def test_doctored_exports_are_refused(store: tuple[str, Signer, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Records removed, a tail cut at an older checkpoint, a boundary moved: each refused."""
    url, signer, _ = store
    key = [signer.verifier]
    doc = _export(url, tmp_path / "all.json", capsys)
    chain = doc["completeness"][0]["chain"]

    # every event of one chain removed, its completeness entry kept
    gone = copy.deepcopy(doc)
    gone["events"] = [e for e in gone["events"] if not e["event_id"].startswith(chain + "#")]
    with pytest.raises(ProofError, match="not all exported"):
        verify_export(gone, key)

    # the chain's tail cut, its 'last' proved against an older (genuine) checkpoint
    entry = doc["completeness"][0]
    forged = _older_checkpoint_proof(url, chain, entry["last_seq"] + 1)
    cut = copy.deepcopy(doc)
    keep = forged["index"]
    cut["events"] = [e for e in cut["events"] if not (
        e["event_id"].startswith(chain + "#") and int(e["event_id"].rsplit("#")[1]) > keep)]
    c0 = cut["completeness"][0]
    c0.update(last_seq=keep, count=keep + 1, last=forged, after=None)
    with pytest.raises(ProofError, match="has not ended"):
        verify_export(cut, key)

    # the head cut from an export 'from the beginning', with a genuine 'before' proof
    head = copy.deepcopy(doc)
    head["events"] = [e for e in head["events"] if e["event_id"] not in (
        f"{chain}#0", f"{chain}#1")]
    h0 = head["completeness"][0]
    before = next(e for e in doc["events"] if e["event_id"] == f"{chain}#1")
    h0.update(first_seq=2, count=h0["count"] - 2, before=_proof_of(url, before["record"]),
              first=_proof_of(url, next(e["record"] for e in doc["events"]
                                        if e["event_id"] == f"{chain}#2")))
    with pytest.raises(ProofError, match="from the beginning"):
        verify_export(head, key)

    # the period's start moved past events the document still holds
    moved = copy.deepcopy(doc)
    moved["period"]["since"] = max(e["timestamp"] for e in doc["events"])
    with pytest.raises(ProofError, match="outside the period"):
        verify_export(moved, key)
    moved = copy.deepcopy(doc)
    moved["period"]["until"] = min(e["timestamp"] for e in doc["events"])
    with pytest.raises(ProofError, match="outside the period"):
        verify_export(moved, key)

    # a completeness entry whose count disagrees with the events
    count = copy.deepcopy(doc)
    count["completeness"][0]["count"] += 1
    with pytest.raises(ProofError, match="count"):
        verify_export(count, key)
    assert verify_export(doc, key) == len(doc["events"])  # the genuine one still verifies


def _proof_of(url: str, record: str) -> dict[str, Any]:
    import asyncio

    from gateway.audit import open_store
    from gateway.audit.proof import prove_record
    from gateway.audit.records import parse_body

    obj = parse_body(record.encode())

    async def run() -> dict[str, Any]:
        store = open_store(url, read_only=True)
        await store.open()
        try:
            rec = (await store.read_records(obj["chain"], obj["seq"], 1))[0]
            return await prove_record(store, rec)
        finally:
            await store.close()
    return asyncio.run(run())
