"""Proof bundles say which record types of a request they prove and warn when one is missing.

A bundle with ``request.completed`` cut out still verifies record by record; ``verify-proof``
must then say that only the start is proven (exit 0, ``warning:`` line, ``warnings`` in
``--json``), and ``prove`` must say so when the log itself has no completion record yet.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from gateway.audit import AuditLog, Signer, open_store, prove, verify_proof, verify_proof_report
from gateway.cli.audit import app


def _write(url: str, signer: Signer) -> None:
    async def run() -> None:
        log = AuditLog(open_store(url), signer, replica_id="r1", checkpoint_every_s=3600)
        await log.start()
        await log.append({"type": "request.started", "request_id": "done"})
        await log.append({"type": "request.completed", "request_id": "done", "status": 200})
        await log.append({"type": "request.started", "request_id": "inflight"})
        await log.append({"type": "request.denied", "request_id": "refused", "status": 401})
        await log.append({"type": "request.completed", "request_id": "orphan", "status": 200})
        await log.close()

    asyncio.run(run())


def _bundle(url: str, request_id: str) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        store = open_store(url, read_only=True)
        await store.open()
        try:
            return await prove(store, request_id)
        finally:
            await store.close()

    return asyncio.run(run())


def test_complete_request_has_no_warning(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    _write(url, signer)
    for rid, types in (("done", ["request.started", "request.completed"]),
                       ("refused", ["request.denied"])):
        bundle = _bundle(url, rid)
        assert bundle.get("warnings", []) == []
        report = verify_proof_report(bundle, [signer.verifier])
        assert report.types == types and report.warnings == []
        assert report.records == verify_proof(bundle, [signer.verifier])


def test_removed_completion_record_is_reported(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    _write(url, signer)
    full = _bundle(url, "done")
    cut = {**full, "entries": full["entries"][:1]}  # request.completed removed
    report = verify_proof_report(cut, [signer.verifier])
    assert report.types == ["request.started"]
    assert len(report.warnings) == 1
    assert "request.started" in report.warnings[0] and "request.completed" in report.warnings[0]
    head = {**full, "entries": full["entries"][1:]}  # request.started removed
    report = verify_proof_report(head, [signer.verifier])
    assert report.types == ["request.completed"] and len(report.warnings) == 1
    assert "no request.started" in report.warnings[0]
    # A warning claimed inside the bundle is not trusted either way: verify-proof recomputes.
    forged = {**cut, "warnings": []}
    assert verify_proof_report(forged, [signer.verifier]).warnings == report_warnings(cut, signer)


def report_warnings(bundle: dict[str, Any], signer: Signer) -> list[str]:
    return verify_proof_report(bundle, [signer.verifier]).warnings


def test_cli_verify_proof_warns_on_a_cut_bundle(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    _write(url, signer)
    pub = tmp_path / "audit.pub"
    pub.write_text(signer.verifier.vkey + "\n")
    runner = CliRunner()
    proof = tmp_path / "proof.json"
    res = runner.invoke(app, ["prove", "done", "--store", url, "--out", str(proof)])
    assert res.exit_code == 0 and "warning:" not in res.output
    res = runner.invoke(app, ["verify-proof", str(proof), "--public-key", str(pub)])
    assert res.exit_code == 0, res.output
    assert "warning:" not in res.output
    assert "request done: proved request.started, request.completed" in res.output

    doc = json.loads(proof.read_text())
    doc["entries"] = doc["entries"][:1]
    proof.write_text(json.dumps(doc))
    res = runner.invoke(app, ["verify-proof", str(proof), "--public-key", str(pub)])
    assert res.exit_code == 0, res.output
    assert "request done: proved request.started" in res.output
    (line,) = [x for x in res.output.splitlines() if x.startswith("warning:")]
    assert "request.completed" in line and "done" in line
    res = runner.invoke(app, ["verify-proof", str(proof), "--public-key", str(pub), "--json"])
    assert res.exit_code == 0
    out = json.loads(res.stdout)
    assert out["ok"] is True and out["types"] == ["request.started"]
    assert len(out["warnings"]) == 1 and "request.completed" in out["warnings"][0]


def test_cli_prove_warns_when_the_log_lacks_the_completion(
    tmp_path: Path, signer: Signer
) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    _write(url, signer)
    runner = CliRunner()
    res = runner.invoke(app, ["prove", "inflight", "--store", url])
    assert res.exit_code == 0, res.output
    bundle = json.loads(res.stdout)
    assert len(bundle["warnings"]) == 1 and "request.completed" in bundle["warnings"][0]
    assert any(x.startswith("warning:") and "in flight" in x for x in res.stderr.splitlines())
    res = runner.invoke(app, ["prove", "orphan", "--store", url])
    assert res.exit_code == 0
    assert "no request.started" in json.loads(res.stdout)["warnings"][0]
    assert "warning:" in res.stderr
