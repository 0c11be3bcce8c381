"""`audit.retention` with the configured store: deleted records younger than the retention fail.

AI Act Art. 26(6): deployers keep the logs at least six months. A young log is fine; a log from
which records were deleted that may be younger than the declared retention is not.
The store is a real SQLite audit store written by the real AuditLog; the pruning is done the
way an operator's clean-up job would, with SQL on the file.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path
from typing import Any

import yaml

from gateway.audit import Signer, write_key_pair
from gateway.preflight import Criteria, Inputs, run_preflight
from gateway.preflight.checks_audit import check_retention
from tests.gateway.audit._audit_helpers import write_log

RETENTION_DAYS = 190


def _config(tmp: Path, url: str | None = None) -> tuple[Path, str, Signer]:
    signer = Signer.generate()
    key, _ = write_key_pair(signer, tmp / "audit.key")
    url = url or f"sqlite://{tmp / 'audit.db'}"
    policy = tmp / "policy.yaml"
    policy.write_text(
        "version: 1\ndata_classes: [public, internal]\ndestinations:\n"
        "  - {id: sim, host: 127.0.0.1, port: 9, region: eu-central-1, jurisdiction: EU, "
        "operator: acme}\nrules:\n  - {id: r, principals: {teams: [a]}, destinations: [sim]}\n")
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 9},
        "models": [{"name": "m", "replicas": [{"url": "http://127.0.0.1:9",
                                               "destination": "sim"}]}],
        "keys": [{"id": "a", "sha256": hashlib.sha256(b"k").hexdigest(), "models": ["m"],
                  "team": "a"}],
        "policy": {"file": str(policy)},
        "audit": {"store": url, "signing_key_file": str(key), "replica_id": "r1"},
    }
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, url, signer


def _retention(config: Path) -> tuple[str, str, dict[str, Any]]:
    report, _ = run_preflight(Inputs(config=config),
                                  Criteria(regions=("eu-central-1",),
                                           retention_days=RETENTION_DAYS))
    check = next(c for c in report.checks if c.id == "audit.retention")
    return check.status, check.verdict, check.evidence


def test_young_unpruned_log_passes_pruned_one_fails(tmp_path: Path) -> None:
    config, url, signer = _config(tmp_path)
    write_log(url, signer, 12, replica="r1")
    write_log(url, signer, 12, replica="r1")
    status, verdict, evidence = _retention(config)
    assert status == "pass", verdict
    assert evidence["store"]["pruned"] == [] and evidence["store"]["records"] == 28
    db = str(tmp_path / "audit.db")
    with sqlite3.connect(db) as conn:
        first = conn.execute("SELECT chain FROM audit_records ORDER BY id LIMIT 1").fetchone()[0]
        conn.execute("DELETE FROM audit_records WHERE chain = ? AND seq < 5", (first,))
    status, verdict, evidence = _retention(config)
    assert status == "fail"
    assert f"chain {first}: records 0..4 deleted" in verdict
    assert f"younger than the declared {RETENTION_DAYS} days" in verdict
    # the same pruning is allowed once the oldest record left is older than the retention
    _, facts = run_preflight(Inputs(config=config),
                             Criteria(regions=("eu-central-1",), retention_days=RETENTION_DAYS))
    later = time.time() + (RETENTION_DAYS + 1) * 86400
    assert check_retention(facts, now_s=later).status == "pass"


def test_a_whole_deleted_chain_is_seen_through_its_successor(tmp_path: Path) -> None:
    config, url, signer = _config(tmp_path)
    write_log(url, signer, 6, replica="r1")
    write_log(url, signer, 6, replica="r1")
    with sqlite3.connect(str(tmp_path / "audit.db")) as conn:
        first = conn.execute("SELECT chain FROM audit_records ORDER BY id LIMIT 1").fetchone()[0]
        for table in ("audit_records", "audit_checkpoints", "audit_chains"):
            conn.execute(f"DELETE FROM {table} WHERE chain = ?", (first,))  # noqa: S608
    status, verdict, _ = _retention(config)
    assert status == "fail" and f"its previous chain {first} is gone" in verdict


def test_recent_pruning_is_not_hidden_by_an_old_chain_elsewhere(tmp_path: Path) -> None:
    """An old, intact chain of one replica does not excuse deleting another replica's recent
    records: what counts is how young the deleted records can be, not the store's oldest."""
    config, url, signer = _config(tmp_path)
    old = write_log(url, signer, 6, replica="r0")
    young = write_log(url, signer, 12, replica="r1")
    shift_us = (RETENTION_DAYS + 200) * 86400 * 10**6
    with sqlite3.connect(str(tmp_path / "audit.db")) as conn:
        for table in ("audit_records", "audit_checkpoints"):  # r0 ran long ago
            conn.execute(f"UPDATE {table} SET ts_us = ts_us - ? WHERE chain = ?",  # noqa: S608
                         (shift_us, old))
    assert _retention(config)[0] == "pass"  # nothing deleted
    with sqlite3.connect(str(tmp_path / "audit.db")) as conn:
        conn.execute("DELETE FROM audit_records WHERE chain = ? AND seq < 5", (young,))
    status, verdict, evidence = _retention(config)
    assert status == "fail", verdict
    assert f"chain {young}: records 0..4 deleted" in verdict
    assert evidence["store"]["oldest_age_days"] > RETENTION_DAYS  # the old chain is still there
    # deleting the old replica's chain (older than the retention) is allowed...
    with sqlite3.connect(str(tmp_path / "audit.db")) as conn:
        conn.execute("DELETE FROM audit_records WHERE chain = ? AND seq < 3", (old,))
    _, facts = run_preflight(Inputs(config=config),
                             Criteria(regions=("eu-central-1",), retention_days=RETENTION_DAYS))
    later = time.time() + (RETENTION_DAYS + 1) * 86400
    assert check_retention(facts, now_s=later).status == "pass"
    # ...and alone it passes today too, while the young chain's pruning alone fails
    result = check_retention(facts)
    assert result.status == "fail" and young in result.verdict and f"{old}:" not in \
        result.verdict


def test_signed_checkpoints_of_a_deleted_chain_date_its_records(tmp_path: Path) -> None:
    """A chain with checkpoints and no record left: its newest checkpoint dates the deleted
    records (old enough: pass; young: fail)."""
    config, url, signer = _config(tmp_path)
    chain = write_log(url, signer, 6, replica="r2")
    with sqlite3.connect(str(tmp_path / "audit.db")) as conn:
        conn.execute("DELETE FROM audit_records WHERE chain = ?", (chain,))
    status, verdict, _ = _retention(config)
    assert status == "fail" and "no record left" in verdict
    _, facts = run_preflight(Inputs(config=config),
                             Criteria(regions=("eu-central-1",), retention_days=RETENTION_DAYS))
    later = time.time() + (RETENTION_DAYS + 1) * 86400
    assert check_retention(facts, now_s=later).status == "pass"


def test_postgresql_store_empty_then_pruned(tmp_path: Path, pg_database: str) -> None:
    """The same rule on a real PostgreSQL store: an empty store passes (nothing to keep yet),
    a deleted head of a young chain fails."""
    from tests.gateway.audit._audit_helpers import raw_sql

    config, url, signer = _config(tmp_path, pg_database)
    write_log(url, signer, 0, replica="r1", close=False)  # creates the schema, one record
    raw_sql(url, "DELETE FROM audit_records")
    raw_sql(url, "DELETE FROM audit_checkpoints")
    raw_sql(url, "DELETE FROM audit_chains")
    status, verdict, evidence = _retention(config)
    assert status == "pass", verdict
    assert evidence["store"]["records"] == 0 and evidence["store"]["oldest_us"] is None
    chain = write_log(url, signer, 12, replica="r1")
    raw_sql(url, "DELETE FROM audit_records WHERE chain = ? AND seq < 3", chain)
    status, verdict, _ = _retention(config)
    assert status == "fail" and f"chain {chain}: records 0..2 deleted" in verdict
