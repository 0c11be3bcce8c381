"""Tampering found by a security-officer QA pass: columns outside the hash, deleted checkpoints.

The stores keep ``ts_us``, ``type`` and ``request_id`` as columns next to the hashed body; ``prove
<request id>``, ``tail`` and ``export --since/--until`` select by them. Editing them must fail
verification naming chain and sequence number. Deleting the checkpoints of a cleanly closed
chain (whose close always signs a final checkpoint) must fail too, not pass with a warning.
"""

from __future__ import annotations

import hashlib
import json

from _audit_helpers import codes_at, raw_sql, verify, write_log

from gateway.audit import Signer
from gateway.audit.records import canonical_json

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
