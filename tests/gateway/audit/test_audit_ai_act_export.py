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
