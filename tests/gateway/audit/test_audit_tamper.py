"""Tampering with a real store (SQLite and PostgreSQL) is detected at the exact position."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from _audit_helpers import codes_at, raw_sql, verify, write_log

from gateway.audit import AuditLog, Signer, open_store
from gateway.audit.checkpoint import Checkpoint, parse_checkpoint_unverified, sign_checkpoint
from gateway.audit.records import make_record
from tests.gateway.gateway_cli import gateway

N = 30  # request records; the chain holds N + 2 (chain.started, chain.closed)


def body_of(url: str, chain: str, seq: int) -> bytes:
    rows = raw_sql(url, "SELECT body FROM audit_records WHERE chain = ? AND seq = ?", chain, seq)
    return bytes(rows[0][0])


def test_clean_log_verifies(store_url: str, signer: Signer) -> None:
    chain = write_log(store_url, signer, N)
    report = verify(store_url, signer)
    assert report.ok, report.findings
    assert report.findings == [] and report.signatures_checked
    [summary] = report.chains
    assert (summary.chain, summary.records, summary.sealed_size) == (chain, N + 2, N + 2)
    assert summary.closed


def test_one_changed_byte(store_url: str, signer: Signer) -> None:
    chain = write_log(store_url, signer, N)
    body = body_of(store_url, chain, 7)
    forged = body.replace(b"req-6", b"req-X")
    assert forged != body and len(forged) == len(body)
    raw_sql(
        store_url, "UPDATE audit_records SET body = ? WHERE chain = ? AND seq = 7", forged, chain
    )
    report = verify(store_url, signer)
    assert not report.ok
    assert ("hash_mismatch", chain, 7) in codes_at(report)
    assert {f.seq for f in report.errors if f.code != "checkpoint_mismatch"} == {7}


def test_changed_record_with_recomputed_hash(store_url: str, signer: Signer) -> None:
    import hashlib

    chain = write_log(store_url, signer, N)
    forged = body_of(store_url, chain, 7).replace(b"req-6", b"req-X")
    new_hash = hashlib.sha256(b"\x00" + forged).digest()
    raw_sql(
        store_url,
        "UPDATE audit_records SET body = ?, hash = ? WHERE chain = ? AND seq = 7",
        forged,
        new_hash,
        chain,
    )
    report = verify(store_url, signer)
    assert ("broken_link", chain, 8) in codes_at(report)
    assert any(
        f.code == "checkpoint_mismatch" and f.seq is not None and f.seq <= 7 for f in report.errors
    )


def test_deleted_middle_record(store_url: str, signer: Signer) -> None:
    chain = write_log(store_url, signer, N)
    raw_sql(store_url, "DELETE FROM audit_records WHERE chain = ? AND seq = 12", chain)
    report = verify(store_url, signer)
    assert ("missing_records", chain, 12) in codes_at(report)
    assert not any(f.code == "broken_link" for f in report.errors)


def test_swapped_records(store_url: str, signer: Signer) -> None:
    chain = write_log(store_url, signer, N)
    b5, b6 = body_of(store_url, chain, 5), body_of(store_url, chain, 6)
    h = {
        s: bytes(
            raw_sql(store_url, "SELECT hash FROM audit_records WHERE chain=? AND seq=?", chain, s)[
                0
            ][0]
        )
        for s in (5, 6)
    }
    sql = "UPDATE audit_records SET body = ?, hash = ? WHERE chain = ? AND seq = ?"
    raw_sql(store_url, sql, b6, h[6], chain, 5)
    raw_sql(store_url, sql, b5, h[5], chain, 6)
    report = verify(store_url, signer)
    found = codes_at(report)
    assert ("out_of_order", chain, 5) in found and ("out_of_order", chain, 6) in found


def test_inserted_record(store_url: str, signer: Signer) -> None:
    chain = write_log(store_url, signer, N)
    for seq in range(N + 1, 8, -1):
        raw_sql(
            store_url,
            "UPDATE audit_records SET seq = ? WHERE chain = ? AND seq = ?",
            seq + 1,
            chain,
            seq,
        )
    prev = bytes(
        raw_sql(store_url, "SELECT hash FROM audit_records WHERE chain=? AND seq=8", chain)[0][0]
    )
    forged = make_record(
        chain=chain,
        seq=9,
        prev=prev,
        ts_us=1,
        type_="request.started",
        data={"request_id": "forged"},
    )
    raw_sql(
        store_url,
        "INSERT INTO audit_records (chain, seq, ts_us, type, request_id, hash, body) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        chain,
        9,
        1,
        forged.type,
        "forged",
        forged.hash,
        forged.body,
    )
    report = verify(store_url, signer)
    assert ("inserted_record", chain, 9) in codes_at(report)


def test_truncated_tail_past_checkpoint(store_url: str, signer: Signer) -> None:
    chain = write_log(store_url, signer, N)
    raw_sql(store_url, "DELETE FROM audit_records WHERE chain = ? AND seq >= 20", chain)
    report = verify(store_url, signer)
    assert ("truncated", chain, 20) in codes_at(report)


def test_checkpoint_resigned_with_foreign_key(store_url: str, signer: Signer) -> None:
    chain = write_log(store_url, signer, N)
    [(size, note)] = raw_sql(
        store_url,
        "SELECT size, note FROM audit_checkpoints WHERE chain = ? ORDER BY size DESC LIMIT 1",
        chain,
    )
    cp = parse_checkpoint_unverified(note)
    foreign = Signer.generate(signer.name)  # same key name, different key
    raw_sql(
        store_url,
        "UPDATE audit_checkpoints SET note = ? WHERE chain = ? AND size = ?",
        sign_checkpoint(Checkpoint(cp.origin, cp.size, cp.root), foreign),
        chain,
        size,
    )
    report = verify(store_url, signer)
    assert ("bad_signature", chain, size) in codes_at(report)
    # The untampered checkpoints still verify, so only the forged one is reported.
    assert {f.code for f in report.errors} == {"bad_signature"}


def test_restored_older_copy_detected_with_exported_checkpoints(
    store_url: str, signer: Signer, tmp_path: Path
) -> None:
    cps = tmp_path / "checkpoints"
    backup = tmp_path / "backup.db"

    async def run() -> str:
        log = AuditLog(open_store(store_url), signer, replica_id="r1", checkpoint_dir=cps)
        await log.start()
        for i in range(10):
            await log.append({"type": "request.started", "request_id": f"a-{i}"})
        await log.checkpoint()
        if store_url.startswith("sqlite://"):
            src = sqlite3.connect(store_url[len("sqlite://") :])
            dst = sqlite3.connect(backup)
            src.backup(dst)
            src.close()
            dst.close()
        for i in range(10):
            await log.append({"type": "request.started", "request_id": f"b-{i}"})
        await log.close()
        return log.chain_id

    chain = asyncio.run(run())
    assert verify(store_url, signer, checkpoint_dir=cps).ok
    if store_url.startswith("sqlite://"):
        shutil.copy(backup, store_url[len("sqlite://") :])
        for suffix in ("-wal", "-shm"):
            Path(store_url[len("sqlite://") :] + suffix).unlink(missing_ok=True)
    else:  # the same older state: the first 11 records and the checkpoints up to them
        raw_sql(store_url, "DELETE FROM audit_records WHERE seq >= 11")
        raw_sql(store_url, "DELETE FROM audit_checkpoints WHERE size > 11")
    older = verify(store_url, signer)
    assert older.ok, "an older copy is self-consistent: only exported checkpoints reveal it"
    report = verify(store_url, signer, checkpoint_dir=cps)
    assert ("rollback", chain, 11) in codes_at(report)


def test_restart_links_chains_and_detects_dropped_tail(store_url: str, signer: Signer) -> None:
    first = write_log(store_url, signer, 12, close=False)
    second = write_log(store_url, signer, 3, prefix="later")
    report = verify(store_url, signer)
    assert report.ok, report.findings
    assert {c.chain for c in report.chains} == {first, second}
    # Drop the first chain's tail together with its checkpoints: self-consistent, but the
    # second chain's start record remembers how long the first one was.
    raw_sql(store_url, "DELETE FROM audit_records WHERE chain = ? AND seq >= 9", first)
    raw_sql(store_url, "DELETE FROM audit_checkpoints WHERE chain = ? AND size > 9", first)
    report = verify(store_url, signer)
    assert ("previous_chain_truncated", first, 9) in codes_at(report)


def test_cli_verify_exit_codes_and_json(store_url: str, signer: Signer, tmp_path: Path) -> None:
    chain = write_log(store_url, signer, N)
    pub = tmp_path / "audit.pub"
    pub.write_text(signer.verifier.vkey + "\n")
    ok = gateway("audit", *["verify", "--store", store_url, "--public-key", str(pub)])
    assert ok.exit_code == 0, ok.output
    assert "OK: no tampering found" in ok.output
    raw_sql(store_url, "DELETE FROM audit_records WHERE chain = ? AND seq = 4", chain)
    bad = gateway("audit", *["verify", "--store", store_url, "--public-key", str(pub), "--json"])
    assert bad.exit_code == 1
    doc = json.loads(bad.output)
    assert doc["ok"] is False
    assert {
        "severity": "error",
        "code": "missing_records",
        "chain": chain,
        "seq": 4,
        "message": "records 4..4 missing (next stored record is 5)",
    } in doc["findings"]
    text = gateway("audit", *["verify", "--store", store_url, "--public-key", str(pub)])
    assert text.exit_code == 1 and f"[{chain} seq 4]" in text.output


def test_cli_verify_usage_and_io_errors(tmp_path: Path) -> None:
    missing = gateway("audit", *["verify", "--store", f"sqlite://{tmp_path / 'none.db'}"])
    assert missing.exit_code == 2
    assert not (tmp_path / "none.db").exists(), "verify must not create a store"
    bad_url = gateway("audit", *["verify", "--store", "mysql://x"])
    assert bad_url.exit_code == 2
    down = gateway("audit", *["verify", "--store", "postgresql://postgres@127.0.0.1:1/x"])
    assert down.exit_code == 2


@pytest.mark.parametrize("gap_s", [0.3])
def test_time_gap_longer_than_heartbeat_fails(tmp_path: Path, signer: Signer, gap_s: float) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"

    async def run() -> str:
        async with AuditLog(open_store(url), signer, replica_id="r1") as log:
            await log.append({"type": "request.started", "request_id": "1"})
            await asyncio.sleep(gap_s)
            await log.append({"type": "request.started", "request_id": "2"})
            return log.chain_id

    chain = asyncio.run(run())
    assert verify(url, signer).ok
    report = verify(url, signer, max_gap_s=gap_s / 3)
    assert ("time_gap", chain, 2) in codes_at(report)


def test_garbage_records_are_reported_not_crashing(tmp_path: Path, signer: Signer) -> None:
    import hashlib

    url = f"sqlite://{tmp_path / 'a.db'}"
    chain = write_log(url, signer, 10)
    spaced = json.dumps(json.loads(body_of(url, chain, 5)), indent=1).encode()
    for seq, body in ((3, b"\xff\xfe not json"), (4, b'{"v":1}'), (5, spaced)):
        raw_sql(
            url,
            "UPDATE audit_records SET body = ?, hash = ? WHERE chain = ? AND seq = ?",
            body,
            hashlib.sha256(b"\x00" + body).digest(),
            chain,
            seq,
        )
    report = verify(url, signer)
    found = codes_at(report)
    assert ("malformed_record", chain, 3) in found
    assert ("malformed_record", chain, 4) in found
    assert ("non_canonical", chain, 5) in found
