"""Tampering found by a security-officer QA pass: columns outside the hash, deleted checkpoints.

The stores keep ``ts_us``, ``type`` and ``request_id`` as columns next to the hashed body; ``prove
<request id>``, ``tail`` and ``export --since/--until`` select by them. Editing them must fail
verification naming chain and sequence number. Deleting the checkpoints of a cleanly closed
chain (whose close always signs a final checkpoint) must fail too, not pass with a warning.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path

import pytest
from _audit_helpers import codes_at, raw_sql, verify, write_log

from gateway.audit import Signer
from gateway.audit.records import canonical_json
from gateway.cli import main

N = 12


def test_request_id_column_changed_hides_a_request_from_prove(
    store_url: str, signer: Signer
) -> None:
    chain = write_log(store_url, signer, N)
    raw_sql(store_url, "UPDATE audit_records SET request_id = ? WHERE chain = ? AND seq = 5",
            "someone-else", chain)
    report = verify(store_url, signer)
    assert not report.ok
    assert codes_at(report) == {("column_mismatch", chain, 5)}
    [finding] = report.errors
    assert "request_id" in finding.message and "someone-else" in finding.message


def test_type_column_changed(store_url: str, signer: Signer) -> None:
    chain = write_log(store_url, signer, N)
    raw_sql(store_url, "UPDATE audit_records SET type = 'audit.heartbeat' WHERE chain = ? "
            "AND seq = 3", chain)
    report = verify(store_url, signer)
    assert codes_at(report) == {("column_mismatch", chain, 3)}
    assert "type" in report.errors[0].message


def test_ts_column_moved_out_of_an_export_window(store_url: str, signer: Signer) -> None:
    chain = write_log(store_url, signer, N)
    raw_sql(store_url, "UPDATE audit_records SET ts_us = ts_us - 86400000000 WHERE chain = ? "
            "AND seq = 8", chain)
    report = verify(store_url, signer)
    assert codes_at(report) == {("column_mismatch", chain, 8)}
    assert "ts_us" in report.errors[0].message


def test_request_id_column_added_to_a_non_request_record(store_url: str, signer: Signer) -> None:
    chain = write_log(store_url, signer, N)
    raw_sql(store_url, "UPDATE audit_records SET request_id = 'req-3' WHERE chain = ? AND seq = 0",
            chain)
    assert codes_at(verify(store_url, signer)) == {("column_mismatch", chain, 0)}


def test_closed_chain_without_checkpoints_fails(store_url: str, signer: Signer) -> None:
    chain = write_log(store_url, signer, N)
    raw_sql(store_url, "DELETE FROM audit_checkpoints WHERE chain = ?", chain)
    report = verify(store_url, signer)
    assert not report.ok
    assert ("missing_checkpoint", chain, 0) in codes_at(report)


def test_rewritten_closed_chain_with_checkpoints_deleted_fails(
    store_url: str, signer: Signer
) -> None:
    """Without the signing key: edit a record, re-link the whole chain, drop the checkpoints."""
    chain = write_log(store_url, signer, N)
    rows = raw_sql(store_url, "SELECT seq, body FROM audit_records WHERE chain = ? ORDER BY seq",
                   chain)
    prev = "0" * 64
    for seq, body in rows:
        obj = json.loads(bytes(body))
        obj["prev"] = prev
        if obj["data"].get("request_id") == "req-4":
            obj["data"]["request_id"] = "req-forged"
        new = canonical_json(obj)
        digest = hashlib.sha256(b"\x00" + new).digest()
        raw_sql(store_url, "UPDATE audit_records SET body = ?, hash = ?, request_id = ? "
                "WHERE chain = ? AND seq = ?", new, digest, obj["data"].get("request_id"),
                chain, seq)
        prev = digest.hex()
    raw_sql(store_url, "DELETE FROM audit_checkpoints WHERE chain = ?", chain)
    report = verify(store_url, signer)
    assert not report.ok
    assert ("missing_checkpoint", chain, 0) in codes_at(report)


def test_untouched_log_still_verifies_clean(store_url: str, signer: Signer) -> None:
    write_log(store_url, signer, N)
    report = verify(store_url, signer)
    assert report.ok and report.findings == []


def test_replica_column_edited_before_restart_keeps_the_chain_link(
    store_url: str, signer: Signer
) -> None:
    """audit_chains.replica/started_us are outside the hash: a restart must not trust them."""
    first = write_log(store_url, signer, 4, replica="r1")
    raw_sql(store_url, "UPDATE audit_chains SET replica = 'elsewhere', started_us = 0")
    second = write_log(store_url, signer, 4, replica="r1")
    start = json.loads(body_of(store_url, second, 0))
    assert start["data"]["previous_chain"] == first
    assert verify(store_url, signer).ok


def test_restart_that_does_not_name_its_predecessor_fails(tmp_path: Path, signer: Signer) -> None:
    """A later chain of the same replica with ``previous_chain: null`` breaks the restart link."""
    older = f"sqlite://{tmp_path / 'a.db'}"
    url = f"sqlite://{tmp_path / 'b.db'}"
    first = write_log(older, signer, 4, replica="r1")
    # Chain ids carry the start second: the second chain must start in a later second.
    second_now = int(time.time())
    deadline = time.monotonic() + 3
    while int(time.time()) == second_now:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = write_log(url, signer, 4, replica="r1")
    assert verify(url, signer).ok
    conn = sqlite3.connect(tmp_path / "b.db", isolation_level=None)
    try:
        conn.execute("ATTACH DATABASE ? AS a", (str(tmp_path / "a.db"),))
        conn.execute("INSERT INTO audit_records (chain, seq, ts_us, type, request_id, hash, body) "
                     "SELECT chain, seq, ts_us, type, request_id, hash, body FROM a.audit_records")
        conn.execute("INSERT INTO audit_checkpoints SELECT * FROM a.audit_checkpoints")
        conn.execute("INSERT INTO audit_chains SELECT * FROM a.audit_chains")
    finally:
        conn.close()
    report = verify(url, signer)
    assert ("previous_chain_unlinked", second, 0) in codes_at(report)
    assert first in report.errors[0].message


def body_of(url: str, chain: str, seq: int) -> bytes:
    rows = raw_sql(url, "SELECT body FROM audit_records WHERE chain = ? AND seq = ?", chain, seq)
    return bytes(rows[0][0])


# Edits made the natural way with the sqlite3 shell change a column's storage class (its
# replace() returns TEXT, hex() is TEXT, a quoted value in an INTEGER column stays TEXT, a
# cast can put bytes that are not UTF-8 into a TEXT column). `gateway audit verify` failed on
# them with `internal_error` (TypeError) or `audit_unavailable` (sqlite3's decode error), exit
# 2 and no finding; it must report the edited record, exit 1.
SQLITE_EDITS = [
    ("UPDATE audit_records SET body = replace(body, 'req-4', 'req-x') WHERE chain = ? AND seq = 5",
     "hash_mismatch", 5, "does not match its stored hash"),
    ("UPDATE audit_records SET hash = lower(hex(hash)) WHERE chain = ? AND seq = 6",
     "hash_mismatch", 6, "does not match its stored hash"),
    # A TEXT seq sorts after every number: seq 7 is missing, the edited row comes last.
    ("UPDATE audit_records SET seq = 'x' WHERE chain = ? AND seq = 7",
     "missing_records", 7, "records 7..7 missing"),
    ("UPDATE audit_records SET seq = 'x' WHERE chain = ? AND seq = 7",
     "column_mismatch", None, "stored column seq='x' is not a sequence number"),
    ("UPDATE audit_records SET type = CAST(x'ff00' AS TEXT) WHERE chain = ? AND seq = 8",
     "column_mismatch", 8, "stored column type="),
    ("UPDATE audit_records SET body = CAST(x'ff00' AS TEXT) WHERE chain = ? AND seq = 9",
     "hash_mismatch", 9, "does not match its stored hash"),
]


def test_sqlite_shell_edits_are_findings_not_crashes(
    tmp_path: Path, signer: Signer, capsys: pytest.CaptureFixture[str]
) -> None:
    pub = tmp_path / "audit.pub"
    pub.write_text(signer.verifier.vkey + "\n")
    for n, (sql, code, seq, text) in enumerate(SQLITE_EDITS):
        url = f"sqlite://{tmp_path / f'a{n}.db'}"
        chain = write_log(url, signer, N)
        raw_sql(url, sql, chain)
        report = verify(url, signer)
        assert not report.ok, sql
        found = [f for f in report.errors if (f.code, f.chain) == (code, chain)
                 and seq in (None, f.seq)]
        assert found and text in found[0].message, (sql, [str(f) for f in report.errors])
        capsys.readouterr()
        assert main(["audit", "verify", "--store", url, "--public-key", str(pub)]) == 1, sql
        assert "internal_error" not in capsys.readouterr().err


def test_an_edited_checkpoint_time_is_not_a_crash(
    tmp_path: Path, signer: Signer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The stored checkpoint time is unsigned metadata (the signed note carries the tree): a
    non-number there crashed the sort of the checkpoints (internal_error, exit 2)."""
    url = f"sqlite://{tmp_path / 'a.db'}"
    chain = write_log(url, signer, N)
    raw_sql(url, "UPDATE audit_checkpoints SET ts_us = 'y' WHERE chain = ? AND size = 13", chain)
    assert verify(url, signer).ok
    pub = tmp_path / "audit.pub"
    pub.write_text(signer.verifier.vkey + "\n")
    capsys.readouterr()
    assert main(["audit", "verify", "--store", url, "--public-key", str(pub)]) == 0
    assert "OK: no tampering found" in capsys.readouterr().out
