"""The bundle's CycloneDX 1.6 ML-BOM: written by pack, covered by the signed index, valid
against the official schema, shown by inspect and checked against the index by verify."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from airgap_helpers import KeyPair, lock_entry_from_dir, make_small_model, write_lock
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from airgap import pack_bundle, verify_bundle
from airgap.cli import main
from airgap.mlbom import BOM_NAME, read_extra
from airgap.signing import sign_index
from airgap.validate import parse_index
from tests.weights import pickle_samples as S
from weights import SCANNER, Lockfile, SerialisationPolicy
from weights.local import local_entry

REPO = "acme/legacy-bert"


@pytest.fixture
def bundle(tmp_path: Path, keys: KeyPair) -> Path:
    src = make_small_model(tmp_path / "src")
    (src / "pytorch_model.bin").write_bytes(S.torch_zip(S.torch_state_dict_pickle()))
    lock = write_lock(tmp_path / "weights.lock", lock_entry_from_dir(src, REPO, license="mit"))
    out = tmp_path / "b"
    pack_bundle(lock, src, out, keys.private, policy=SerialisationPolicy(allow_pickle=True))
    return out


def _bom(bundle: Path) -> dict[str, object]:
    index = parse_index((bundle / "index.json").read_bytes())
    data = read_extra(bundle, index, BOM_NAME)
    assert data is not None
    return json.loads(data)  # type: ignore[no-any-return]


def test_bom_is_valid_cyclonedx_1_6_and_describes_each_file(bundle: Path) -> None:
    index = json.loads((bundle / "index.json").read_text())
    (entry,) = [f for f in index["files"] if f["path"] == BOM_NAME and f["repo_id"] is None]
    index_obj = parse_index((bundle / "index.json").read_bytes())
    data = read_extra(bundle, index_obj, BOM_NAME)
    assert data is not None and hashlib.sha256(data).hexdigest() == entry["sha256"]
    errors = JsonStrictValidator(SchemaVersion.V1_6).validate_str(data.decode())
    assert errors is None, errors
    doc = json.loads(data)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    (model,) = doc["components"]
    locked = index["lock"]["models"][0]
    assert model["type"] == "machine-learning-model" and model["name"] == REPO
    assert model["version"] == locked["commit"]
    assert model["purl"] == f"pkg:huggingface/acme/legacy-bert@{locked['commit']}"
    assert model["supplier"]["name"] == "acme"
    assert model["licenses"] == [{"license": {"id": "MIT"}}]
    files = {f["name"]: f for f in model["components"]}
    assert {n: f["hashes"] for n, f in files.items()} == {
        f["path"]: [{"alg": "SHA-256", "content": f["sha256"]}] for f in locked["files"]}
    props = {p["name"]: p["value"] for p in files["pytorch_model.bin"]["properties"]}
    assert props["sovereign-gateway:serialisation"] == "pickle"
    assert props["sovereign-gateway:scan"].startswith(f"{SCANNER}: safe")
    formats = {p["name"]: p["value"] for p in model["properties"]}
    assert formats["sovereign-gateway:serialisation-formats"] == "data,pickle"


def test_verify_accepts_the_bom_and_refuses_one_that_disagrees_with_the_index(
    bundle: Path, keys: KeyPair, tmp_path: Path
) -> None:
    assert verify_bundle(bundle, [keys.public]).ok
    # A signer who ships a BOM that lies about a hash: its bytes match the index, its meaning
    # does not. Rebuild the payload with a doctored BOM and re-sign.
    bad = tmp_path / "doctored"
    shutil.copytree(bundle, bad)
    index = parse_index((bad / "index.json").read_bytes())
    doc = _bom(bad)
    model = doc["components"][0]  # type: ignore[index]
    model["components"][0]["hashes"][0]["content"] = "0" * 64
    src = tmp_path / "src"
    (tmp_path / "extra").mkdir()
    doctored = tmp_path / "extra" / "notes.txt"
    doctored.write_text("x")
    lock = Lockfile(entries=index.lock.entries)
    out = tmp_path / "b2"
    pack_bundle(lock, src, out, keys.private, include_files=[doctored],
                policy=SerialisationPolicy(allow_pickle=True))
    # swap the BOM bytes in the new bundle for the doctored ones, fixing up the index
    idx = json.loads((out / "index.json").read_text())
    data = (json.dumps(doc, indent=2) + "\n").encode()
    good = read_extra(out, parse_index((out / "index.json").read_bytes()), BOM_NAME)
    assert good is not None
    payload = b"".join((out / p["name"]).read_bytes() for p in idx["parts"])
    (bom_blob,) = [b for b in idx["blobs"] if b["sha256"] == hashlib.sha256(good).hexdigest()]
    start = bom_blob["offset"]
    payload = payload[:start] + data + payload[start + bom_blob["stored_size"]:]
    sha = hashlib.sha256(data).hexdigest()
    for f in idx["files"]:
        if f["path"] == BOM_NAME:
            f.update(size=len(data), sha256=sha, blob_id=sha)
    delta = len(data) - bom_blob["stored_size"]
    after = False
    for b in idx["blobs"]:
        if after:
            b["offset"] += delta
        if b is bom_blob:
            b.update(sha256=sha, size=len(data), stored_size=len(data))
            after = True
    for p in idx["parts"]:
        out.joinpath(p["name"]).unlink()
    idx["payload_size"] = len(payload)
    idx["parts"] = [{"name": "payload.000-of-001", "offset": 0, "size": len(payload),
                     "sha256": hashlib.sha256(payload).hexdigest()}]
    idx["part_size"] = max(idx["part_size"], len(payload))
    (out / "payload.000-of-001").write_bytes(payload)
    raw = parse_index(json.dumps(idx).encode()).dumps()
    (out / "index.json").write_bytes(raw)
    (out / "index.sig").write_bytes(sign_index(raw, keys.private))
    report = verify_bundle(out, [keys.public])
    assert not report.ok
    assert [p.code for p in report.problems] == ["mlbom_mismatch"]
    assert "file hashes differ" in report.problems[0].message


def test_inspect_shows_the_bom(bundle: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(bundle)]) == 0
    text = capsys.readouterr().out
    # Wrapped at word boundaries when piped (the file list is tab-separated, one file a line).
    assert all(len(line) <= 80 for line in text.splitlines() if "\t" not in line), text
    out = " ".join(text.split())  # as read: a phrase may wrap between two words
    assert f"ML-BOM {BOM_NAME}: CycloneDX 1.6" in out
    assert f"machine-learning-model {REPO}@" in out and "1 scanned pickle(s)" in out


def test_local_origin_is_a_claim_in_the_bom(minilm_snapshot: Path, tmp_path: Path,
                                            keys: KeyPair) -> None:
    claim = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
    entry = local_entry(minilm_snapshot, repo_id="site/minilm",
                        claimed_repo_id="sentence-transformers/all-MiniLM-L6-v2",
                        claimed_commit=claim)
    lock = write_lock(tmp_path / "weights.lock", entry)
    out = tmp_path / "b"
    pack_bundle(lock, minilm_snapshot, out, keys.private)
    data = read_extra(out, parse_index((out / "index.json").read_bytes()), BOM_NAME)
    assert data is not None
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(data.decode()) is None
    model = json.loads(data)["components"][0]
    props = {p["name"]: p["value"] for p in model["properties"]}
    assert props["sovereign-gateway:origin"] == "local"
    assert props["sovereign-gateway:origin-path"] == str(minilm_snapshot.absolute())
    assert props["sovereign-gateway:upstream-claim"] == "not verified"
    assert props["sovereign-gateway:serialisation-formats"] == "data,safetensors"
    assert "purl" not in model  # a claim is never the component's identity
    assert props["sovereign-gateway:upstream-claimed-purl"] == \
        f"pkg:huggingface/sentence-transformers/all-MiniLM-L6-v2@{claim}"
    assert model["version"] == entry.commit != claim
    assert model["licenses"] == [{"license": {"id": "Apache-2.0"}}]
