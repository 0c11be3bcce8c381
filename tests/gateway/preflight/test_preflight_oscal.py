"""`gateway preflight --oscal`: OSCAL documents the real compliance-trestle validates, signed.

compliance-trestle (PyPI, pinned in the dev group) is the OSCAL project tooling: its pydantic
models are generated from NIST's OSCAL JSON schemas (OSCAL 1.2.1 for trestle 5.2), and
``trestle validate`` runs them and its own reference checks in a trestle workspace.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from trestle.oscal import OSCAL_VERSION as TRESTLE_OSCAL_VERSION
from trestle.oscal.assessment_results import AssessmentResults
from trestle.oscal.component import ComponentDefinition

from gateway.cli import main
from gateway.preflight import CRITERIA, Criteria, Inputs, run_preflight
from gateway.preflight.oscal import (
    OSCAL_VERSION,
    load_mapping,
    mapping_table,
    oscal_control_id,
)
from tests.gateway.preflight.conftest import REPO, SCENARIO_POLICY

TRESTLE = Path(sys.executable).with_name("trestle")


def _run(tmp_path: Path, key: Path, *extra: str) -> tuple[int, Path, Path]:
    oscal, out = tmp_path / "oscal", tmp_path / "pack"
    code = main(["preflight", "--policy", str(SCENARIO_POLICY), *extra, "--oscal", str(oscal),
                 "--out", str(out), "--sign-key", str(key)])
    return code, oscal, out


def _trestle_validate(tmp_path: Path, oscal: Path) -> subprocess.CompletedProcess[str]:
    ws = tmp_path / "trestle-ws"
    ws.mkdir()
    subprocess.run([str(TRESTLE), "init"], cwd=ws, check=True, capture_output=True)
    for kind, name in (("assessment-results", "assessment-results.json"),
                       ("component-definitions", "component-definition.json")):
        (ws / kind / "sg").mkdir(parents=True)
        shutil.copy(oscal / name, ws / kind / "sg" / name)
    return subprocess.run([str(TRESTLE), "validate", "-a"], cwd=ws, capture_output=True,
                          text=True)


def test_oscal_documents_validate_and_are_signed_subjects(
        tmp_path: Path, operator_key: tuple[Path, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    code, oscal, out = _run(tmp_path, operator_key[0], "--region", "eu-central-1")
    assert code == 0, capsys.readouterr()
    results = AssessmentResults.oscal_read(oscal / "assessment-results.json")
    comp = ComponentDefinition.oscal_read(oscal / "component-definition.json")
    assert results is not None and comp is not None
    assert results.metadata.oscal_version.root.root == OSCAL_VERSION == TRESTLE_OSCAL_VERSION
    done = _trestle_validate(tmp_path, oscal)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("VALID: Model") == 2
    # each check that ran is a finding; its observation's evidence resolves to back-matter
    # resources whose SHA-256 is that of the pack file they name
    run = results.results[0]
    findings = {f.title: f for f in run.findings or ()}
    observations = {o.uuid: o for o in run.observations or ()}
    resources = {r.uuid: r for r in results.back_matter.resources}
    assert findings["policy.destinations"].target.status.state.value == "satisfied"
    assert "policy.destinations" in findings and "k8s.images" not in findings  # skipped
    report = json.loads((out / "report.json").read_text())
    assert sorted(o.title for o in observations.values()) == sorted(
        c["id"] for c in report["checks"])
    obs = observations[findings["policy.destinations"].related_observations[0].observation_uuid]
    hrefs = [e.href for e in obs.relevant_evidence or ()]
    named = {resources[h.removeprefix("#")].title: resources[h.removeprefix("#")]
             for h in hrefs}
    assert sorted(named) == ["evidence/policy.json", "report.json"]
    for name, res in named.items():
        digest = res.rlinks[0].hashes[0]
        assert getattr(digest.algorithm, "value", digest.algorithm) == "SHA-256"
        assert digest.value == hashlib.sha256((out / name).read_bytes()).hexdigest()
    evidenced = {p.value for p in findings["policy.destinations"].props or ()
                 if p.name == "evidences"}
    assert evidenced == {"SOV-3", "SOV-2", "CADA-AL1", "COS-08"}
    # the OSCAL files in the pack are the ones written to --oscal, and signed subjects
    for name in ("assessment-results.json", "component-definition.json"):
        assert (out / "oscal" / name).read_bytes() == (oscal / name).read_bytes()
    capsys.readouterr()
    assert main(["preflight", "verify", str(out), "--key", str(operator_key[1]),
                 "--json"]) == 0
    subjects = json.loads(capsys.readouterr().out)["subjects"]
    assert {"oscal/assessment-results.json", "oscal/component-definition.json"} <= set(subjects)


def test_failed_check_is_a_not_satisfied_finding(
        tmp_path: Path, operator_key: tuple[Path, Path]) -> None:
    code, oscal, _ = _run(tmp_path, operator_key[0], "--region", "us-east-1")
    assert code == 1
    results = AssessmentResults.oscal_read(oscal / "assessment-results.json")
    finding = next(f for f in results.results[0].findings or ()
                   if f.title == "policy.destinations")
    assert finding.target.status.state.value == "not-satisfied"
    assert "us-east-1" in finding.description or "eu-central-1" in finding.description


def test_tampered_oscal_file_fails_pack_verification_and_openssl_recipe(
        tmp_path: Path, operator_key: tuple[Path, Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    priv, pub = operator_key
    code, _, out = _run(tmp_path, priv, "--region", "eu-central-1")
    assert code == 0
    env = json.loads((out / "envelope.dsse.json").read_text())
    payload = base64.b64decode(env["payload"])
    t = env["payloadType"].encode()
    (tmp_path / "pae.bin").write_bytes(b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload),
                                                                payload))
    (tmp_path / "sig.bin").write_bytes(base64.b64decode(env["signatures"][0]["sig"]))
    ossl = subprocess.run(["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(pub),
                           "-rawin", "-in", str(tmp_path / "pae.bin"), "-sigfile",
                           str(tmp_path / "sig.bin")], capture_output=True, text=True)
    assert ossl.returncode == 0 and "Signature Verified Successfully" in ossl.stdout, ossl
    sums = "".join(f"{s['digest']['sha256']}  {s['name']}\n"
                   for s in json.loads(payload)["subject"])
    assert "oscal/assessment-results.json" in sums
    ok = subprocess.run(["sha256sum", "-c", "-"], input=sums, cwd=out, capture_output=True,
                        text=True)
    assert ok.returncode == 0, ok.stdout
    target = out / "oscal/assessment-results.json"
    target.write_text(target.read_text().replace('"satisfied"', '"not-satisfied"', 1))
    capsys.readouterr()
    assert main(["preflight", "verify", str(out), "--key", str(pub), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["problems"] == [
        "oscal/assessment-results.json: content differs from the signed digest"]
    bad = subprocess.run(["sha256sum", "-c", "-"], input=sums, cwd=out, capture_output=True,
                         text=True)
    assert bad.returncode == 1 and "oscal/assessment-results.json: FAILED" in bad.stdout


def test_trestle_rejects_a_broken_document(tmp_path: Path,
                                           operator_key: tuple[Path, Path]) -> None:
    """The validator can fail: without reviewed-controls the results are not OSCAL."""
    _, oscal, _ = _run(tmp_path, operator_key[0], "--region", "eu-central-1")
    doc = json.loads((oscal / "assessment-results.json").read_text())
    del doc["assessment-results"]["results"][0]["reviewed-controls"]
    (oscal / "assessment-results.json").write_text(json.dumps(doc))
    done = _trestle_validate(tmp_path, oscal)
    assert done.returncode != 0
    assert "reviewed-controls" in done.stdout + done.stderr


def test_mapping_covers_every_check_and_marks_its_citations() -> None:
    mapping = load_mapping()
    report, _ = run_preflight(Inputs(), Criteria(regions=("eu-central-1",)))
    live = {"telemetry.destinations"}  # gateway.preflight.continuous's own check
    assert {c.id for c in report.checks} | live == set(mapping.checks)
    for check in report.checks:
        # the report's own criteria are all in the mapping (the mapping may add others)
        assert set(check.criteria) <= set(mapping.checks[check.id]["controls"]), check.id
    assert set(CRITERIA) <= {c for fw in mapping.frameworks.values() for c in fw["controls"]}
    for key, fw in mapping.frameworks.items():
        assert fw["citation"] in ("verified", "secondary", "ours"), key
        for control, meta in fw["controls"].items():
            assert meta["citation"] in ("verified", "secondary", "ours"), control
    assert oscal_control_id("AIA-26(6)") == "AIA-26.6"


def test_docs_table_is_the_shipped_mapping() -> None:
    """docs/evidence.md shows the mapping as shipped (regenerate it from mapping_table)."""
    doc = (REPO / "docs" / "evidence.md").read_text(encoding="utf-8")
    assert mapping_table(load_mapping()) in doc


def test_pack_with_oscal_subjects_verifies_with_securesystemslib(
        tmp_path: Path, operator_key: tuple[Path, Path]) -> None:
    """The secure-systems-lab reference implementation of DSSE accepts the envelope, and the
    payload it returns lists the OSCAL files with the digests of the bytes on disk."""
    from cryptography.hazmat.primitives import serialization
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError
    from securesystemslib.signer import SSlibKey

    priv, pub = operator_key
    code, _, out = _run(tmp_path, priv, "--region", "eu-central-1")
    assert code == 0
    env = json.loads((out / "envelope.dsse.json").read_text())
    raw = serialization.load_pem_public_key(pub.read_bytes()).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    key = SSlibKey(env["signatures"][0]["keyid"], "ed25519", "ed25519", {"public": raw.hex()})
    envelope = Envelope.from_dict(copy.deepcopy(env))  # from_dict consumes its argument
    assert list(envelope.verify([key], 1)) == [key.keyid]
    statement = json.loads(envelope.payload)
    digests = {s["name"]: s["digest"]["sha256"] for s in statement["subject"]}
    for name in ("oscal/assessment-results.json", "oscal/component-definition.json"):
        assert digests[name] == hashlib.sha256((out / name).read_bytes()).hexdigest()
    # one changed payload byte: the reference implementation refuses it
    env["payload"] = base64.b64encode(envelope.payload.replace(b'"pass"', b'"fail"', 1)).decode()
    with pytest.raises(VerificationError):
        Envelope.from_dict(env).verify([key], 1)


def _uuids(node: object, out: list[str] | None = None) -> list[str]:
    """Every ``uuid`` an OSCAL document defines (not the ``*-uuid`` references)."""
    out = [] if out is None else out
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "uuid":
                out.append(v)
            _uuids(v, out)
    elif isinstance(node, list):
        for v in node:
            _uuids(v, out)
    return out


def test_results_uuids_are_stable_for_one_run_and_unique_across_runs() -> None:
    """OSCAL: a uuid identifies one subject. Two runs in the same second with other results
    (two replicas, two regions) are two assessments; the same run gives the same bytes."""
    import dataclasses

    from gateway.preflight.evidence import evidence_files
    from gateway.preflight.oscal import oscal_files
    from gateway.preflight.report import CheckResult

    eu, facts_eu = run_preflight(Inputs(policy=SCENARIO_POLICY),
                                 Criteria(regions=("eu-central-1",)))
    us, facts_us = run_preflight(Inputs(policy=SCENARIO_POLICY), Criteria(regions=("us-east-1",)))
    us = dataclasses.replace(us, generated_at=eu.generated_at)  # the same second
    docs = []
    for report, facts in ((eu, facts_eu), (us, facts_us), (eu, facts_eu)):
        files = oscal_files(report, evidence_files(report, facts))
        docs.append((files["oscal/assessment-results.json"],
                     json.loads(files["oscal/assessment-results.json"])))
    assert docs[0][0] == docs[2][0]  # stable: same report, same bytes
    (_, a), (_, b) = docs[0], docs[1]
    assert a["assessment-results"]["uuid"] != b["assessment-results"]["uuid"]
    assert not set(_uuids(a["assessment-results"]["results"])) & set(
        _uuids(b["assessment-results"]["results"]))
    # two checks reported under one id (a registered check that raised, twice): still unique
    twice = dataclasses.replace(eu, checks=(*eu.checks, CheckResult(
        "check.x", "t", "fail", "raised"), CheckResult("check.x", "t", "fail", "raised")))
    doc = json.loads(oscal_files(twice, evidence_files(twice, facts_eu))[
        "oscal/assessment-results.json"])
    ids = _uuids(doc)
    assert len(ids) == len(set(ids))


def test_oscal_digests_are_of_the_pack_files_while_the_log_grows(
        tmp_path: Path, operator_key: tuple[Path, Path]) -> None:
    """`gateway preflight --config` reads the newest checkpoint from the store. With a gateway
    writing checkpoints meanwhile, the OSCAL back-matter must still carry the digests of the
    files in the pack (it read the store once for OSCAL and again for the pack: 15 of 15
    runs differed on evidence/checkpoint.txt)."""
    import asyncio
    import threading

    import yaml

    from gateway.audit import AuditLog, Signer, open_store, write_key_pair

    signer = Signer.generate()
    key, pub = write_key_pair(signer, tmp_path / "audit.key")
    url = f"sqlite://{tmp_path / 'audit.db'}"
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "models": [{"name": "m", "replicas": [{"url": "http://127.0.0.1:9"}]}],
        "audit": {"store": url, "signing_key_file": str(key), "replica_id": "r1"}}))
    stop, started = threading.Event(), threading.Event()

    async def write() -> None:
        log = AuditLog(open_store(url), signer, replica_id="r1", checkpoint_every_records=1,
                       checkpoint_every_s=0.001)
        await log.start()
        started.set()
        i = 0
        while not stop.is_set():
            await log.append({"type": "request.started", "request_id": f"x-{i}"})
            i += 1
            await asyncio.sleep(0.001)
        await log.close()

    writer = threading.Thread(target=asyncio.run, args=(write(),))
    writer.start()
    mismatched = []
    try:
        assert started.wait(30)
        for n in range(3):
            out = tmp_path / f"pack{n}"
            main(["preflight", "--config", str(config), "--audit-public-key", str(pub),
                  "--oscal", str(tmp_path / f"oscal{n}"), "--out", str(out),
                  "--sign-key", str(operator_key[0]), "--json"])
            doc = json.loads((out / "oscal" / "assessment-results.json").read_text())
            for res in doc["assessment-results"]["back-matter"]["resources"]:
                link = res["rlinks"][0]
                if hashlib.sha256((out / res["title"]).read_bytes()).hexdigest() != \
                        link["hashes"][0]["value"]:
                    mismatched.append((n, link["href"]))
    finally:
        stop.set()
        writer.join(30)
    assert (out / "evidence" / "checkpoint.txt").is_file()
    assert mismatched == []


def test_back_matter_links_resolve_inside_the_pack(
        tmp_path: Path, operator_key: tuple[Path, Path]) -> None:
    """An rlink ``href`` is a URI reference resolved against the document (RFC 3986 5.2): from
    ``oscal/assessment-results.json``, ``report.json`` would name ``oscal/report.json``."""
    from urllib.parse import urljoin

    code, _, out = _run(tmp_path, operator_key[0], "--region", "eu-central-1")
    assert code == 0
    doc_path = out / "oscal" / "assessment-results.json"
    doc = json.loads(doc_path.read_text())
    resources = doc["assessment-results"]["back-matter"]["resources"]
    assert resources
    for res in resources:
        link = res["rlinks"][0]
        target = Path(urljoin(doc_path.as_uri(), link["href"]).removeprefix("file://"))
        assert target.is_file(), (link["href"], target)
        assert hashlib.sha256(target.read_bytes()).hexdigest() == link["hashes"][0]["value"]
        assert target.relative_to(out).as_posix() == res["title"]
