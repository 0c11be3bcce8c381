"""``gateway preflight verify`` shows the signed result and date and refuses (exit 1) a pack
whose result is FAIL or that is older than --max-age, unless told otherwise; the weights
evidence records what was checked by digest (lockfile, signature, signer key)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from gateway.cli import main
from gateway.preflight import Criteria, Inputs, run_preflight, write_pack
from gateway.preflight.report import Report
from tests.gateway.preflight.conftest import SCENARIO_POLICY
from tests.gateway.preflight.test_preflight_weights import signed_model  # noqa: F401 (fixture)


def _pack(tmp_path: Path, key: Path, *, fail: bool = False, days_old: int = 0) -> Path:
    criteria = Criteria(regions=("eu-central-1",) if not fail else ("mars-north-1",))
    report, facts = run_preflight(Inputs(policy=SCENARIO_POLICY), criteria)
    assert (report.exit_code == 1) is fail
    stamp = (dt.datetime.now(dt.UTC) - dt.timedelta(days=days_old)).replace(microsecond=0)
    report = Report(report.checks, report.inputs, stamp.isoformat().replace("+00:00", "Z"))
    out = tmp_path / f"pack-{fail}-{days_old}"
    write_pack(out, report, facts, key)
    return out


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["preflight", "verify", *args])
    return code, capsys.readouterr().out


def test_a_fail_pack_is_shown_as_fail_and_exits_1(
    tmp_path: Path, operator_key: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    pack = _pack(tmp_path, operator_key[0], fail=True)
    code, out = _run([str(pack), "--key", str(operator_key[1])], capsys)
    assert code == 1
    assert "signature: verified" in out and "result: FAIL, generated 20" in out
    assert "the pack's result is FAIL" in out and out.rstrip().splitlines()[-1].startswith(
        "FAILED")
    code, out = _run([str(pack), "--key", str(operator_key[1]), "--allow-fail"], capsys)
    assert code == 0 and "result: FAIL" in out


def test_an_old_pack_exits_1_unless_max_age_allows_it(
    tmp_path: Path, operator_key: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    pack = _pack(tmp_path, operator_key[0], days_old=45)
    code, out = _run([str(pack), "--key", str(operator_key[1]), "--json"], capsys)
    doc = json.loads(out)
    assert code == 1 and doc["ok"] and not doc["accepted"] and doc["result"] == "pass"
    assert doc["age_s"] >= 45 * 86400 and "older than --max-age" in doc["refusals"][0]
    code, _ = _run([str(pack), "--key", str(operator_key[1]), "--max-age", "60d"], capsys)
    assert code == 0
    code, _ = _run([str(pack), "--key", str(operator_key[1]), "--max-age", "none"], capsys)
    assert code == 0
    code, _ = _run([str(pack), "--key", str(operator_key[1]), "--max-age", "soon"], capsys)
    assert code == 2


def test_a_fresh_pass_pack_is_accepted_and_shows_its_date(
    tmp_path: Path, operator_key: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    pack = _pack(tmp_path, operator_key[0])
    code, out = _run([str(pack), "--key", str(operator_key[1])], capsys)
    assert code == 0 and "result: PASS, generated 20" in out


def test_weights_evidence_records_digests_of_what_was_checked(
    signed_model: Inputs,  # noqa: F811 (the fixture)
) -> None:
    report, _ = run_preflight(signed_model, Criteria())
    check = next(c for c in report.checks if c.id == "weights.locked-signed")
    assert check.status == "pass"
    ev = check.evidence
    assert signed_model.lockfile is not None and signed_model.weights_signature is not None
    assert signed_model.weights_public_key is not None
    assert ev["lockfile_sha256"] == hashlib.sha256(signed_model.lockfile.read_bytes()).hexdigest()
    assert ev["signature_sha256"] == hashlib.sha256(
        signed_model.weights_signature.read_bytes()).hexdigest()
    key = serialization.load_pem_public_key(signed_model.weights_public_key.read_bytes())
    der = key.public_bytes(serialization.Encoding.DER,
                           serialization.PublicFormat.SubjectPublicKeyInfo)
    assert ev["signer_key_sha256"] == hashlib.sha256(der).hexdigest()
