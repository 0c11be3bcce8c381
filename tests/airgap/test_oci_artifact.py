"""OCI model artifacts: a verified bundle's model as an OCI image layout with CNCF ModelPack
media types and the signed index attached, pushed to a real registry (Debian's
docker-registry on loopback) and pulled back with real skopeo, then verified offline."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from airgap_helpers import KeyPair, lock_entry_from_dir, make_small_model, write_lock

from airgap import pack_bundle
from airgap.cli import main
from airgap.oci import (
    ARTIFACT,
    CONFIG,
    DOC,
    FILEPATH,
    WEIGHT,
    WEIGHT_CONFIG,
    export_oci,
    verify_oci,
)
from tests.hub_fixtures import MINILM
from weights import Lockfile

TOOLS = ("skopeo", "docker-registry")


def _blob(layout: Path, digest: str) -> bytes:
    return (layout / "blobs" / "sha256" / digest.split(":", 1)[1]).read_bytes()


def _manifest(layout: Path) -> dict[str, object]:
    top = json.loads((layout / "index.json").read_text())
    return json.loads(_blob(layout, top["manifests"][0]["digest"]))  # type: ignore[no-any-return]


@pytest.fixture
def small(tmp_path: Path, keys: KeyPair) -> tuple[Lockfile, Path]:
    src = make_small_model(tmp_path / "src")
    (src / "README.md").write_text("---\nlicense: mit\n---\n# tiny\n")
    lock = write_lock(tmp_path / "weights.lock", lock_entry_from_dir(src, "acme/tiny"))
    bundle = tmp_path / "bundle"
    pack_bundle(lock, src, bundle, keys.private)
    return lock, bundle


def test_export_prints_the_push_command_with_the_tag_it_wrote(
    small: tuple[Lockfile, Path], keys: KeyPair, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The printed ``skopeo copy`` said ``oci:DIR:TAG ... NAME:TAG``; without ``--tag`` the
    layout's reference is the commit's first 12 hex, which the operator had to dig out of
    ``index.json``."""
    lock, bundle = small
    ref = lock.entry("acme/tiny").commit[:12]
    capsys.readouterr()
    assert main(["oci-export", str(bundle), "--public-key", str(keys.public_path),
                 "--out", str(tmp_path / "oci")]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert f"push with: skopeo copy oci:{tmp_path / 'oci'}:{ref} " \
        f"docker://REGISTRY/acme/tiny:{ref}" in printed, printed


def test_layout_uses_modelpack_media_types_and_pinned_digests(
    small: tuple[Lockfile, Path], keys: KeyPair, tmp_path: Path
) -> None:
    lock, bundle = small
    layout = export_oci(bundle, [keys.public], tmp_path / "oci", tag="v1")
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    m = _manifest(layout)
    assert m["artifactType"] == ARTIFACT and m["config"]["mediaType"] == CONFIG  # type: ignore[index]
    layers = {x["annotations"][FILEPATH]: x for x in m["layers"]}  # type: ignore[attr-defined]
    entry = lock.entry("acme/tiny")
    for f in entry.files:
        assert layers[f.path]["digest"] == f"sha256:{f.sha256}"
        assert layers[f.path]["size"] == f.size
        assert _blob(layout, layers[f.path]["digest"]) == (
            bundle.parent / "src" / f.path).read_bytes()
    assert layers["model.safetensors"]["mediaType"] == WEIGHT
    assert layers["README.md"]["mediaType"] == DOC
    assert layers["config.json"]["mediaType"] == WEIGHT_CONFIG
    assert _blob(layout, layers[".airgap/index.json"]["digest"]) == (
        bundle / "index.json").read_bytes()
    config = json.loads(_blob(layout, m["config"]["digest"]))  # type: ignore[index]
    assert config["descriptor"]["revision"] == entry.commit
    assert config["modelfs"]["diffIds"] == [x["digest"] for x in m["layers"]]  # type: ignore[attr-defined]
    report = verify_oci(layout, [keys.public])
    assert report.ok, report.problems
    assert report.layers == {f.path: f"sha256:{f.sha256}" for f in entry.files}


def test_tampered_layer_and_untrusted_key_are_refused(
    small: tuple[Lockfile, Path], keys: KeyPair, other_keys: KeyPair, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lock, bundle = small
    layout = export_oci(bundle, [keys.public], tmp_path / "oci")
    assert [p.code for p in verify_oci(layout, [other_keys.public]).problems] == [
        "signature_untrusted_key"]
    f = lock.entry("acme/tiny").file("model.safetensors")
    blob = layout / "blobs" / "sha256" / f.sha256
    data = bytearray(blob.read_bytes())
    data[1000] ^= 1
    blob.write_bytes(bytes(data))
    rc = main(["oci-verify", str(layout), "--public-key", str(keys.public_path)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "FAIL oci_digest_mismatch: acme/tiny:model.safetensors: blob bytes differ" in err


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    """Debian's docker-registry (distribution 2.x) on a free loopback port."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: apt-get install skopeo docker-registry "
                    "(.ci/run does)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "registry.yml"
    cfg.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path}/reg\n"
                   f"http:\n  addr: 127.0.0.1:{port}\n")
    log = (tmp_path / "registry.log").open("wb")
    proc = subprocess.Popen(["docker-registry", "serve", str(cfg)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://{url}/v2/", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"registry did not start: {(tmp_path / 'registry.log').read_text()}")
            time.sleep(0.1)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def _skopeo(*args: str) -> None:
    r = subprocess.run(["skopeo", *args], capture_output=True, text=True, timeout=300,
                       check=False)
    assert r.returncode == 0, r.stderr


def test_minilm_artifact_survives_a_registry_round_trip_with_skopeo(
    minilm_snapshot: Path, keys: KeyPair, registry: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lock = write_lock(tmp_path / "weights.lock", lock_entry_from_dir(minilm_snapshot, MINILM))
    bundle = tmp_path / "bundle"
    pack_bundle(lock, minilm_snapshot, bundle, keys.private)
    assert main(["oci-export", str(bundle), "--public-key", str(keys.public_path),
                 "--out", str(tmp_path / "oci"), "--tag", "v1"]) == 0
    ref = f"docker://{registry}/sentence-transformers/all-minilm-l6-v2:v1"
    _skopeo("copy", "--dest-tls-verify=false", f"oci:{tmp_path / 'oci'}:v1", ref)
    _skopeo("copy", "--src-tls-verify=false", ref, f"oci:{tmp_path / 'pulled'}:v1")
    capsys.readouterr()
    rc = main(["oci-verify", str(tmp_path / "pulled"), "--public-key", str(keys.public_path),
               "--tag", "v1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0, doc
    entry = lock.entry(MINILM)
    assert doc["repo_id"] == MINILM and doc["commit"] == entry.commit
    assert doc["layers"] == {f.path: f"sha256:{f.sha256}" for f in entry.files}


# protocol-4 pickle of os.system("id")
_PICKLE = (b"\x80\x04\x95\x15\x00\x00\x00\x00\x00\x00\x00"
           b"\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R.")


def _add_layer(layout: Path, layer: dict[str, object], data: bytes, at: int = 0) -> str:
    """Insert a layer holding ``data`` into the manifest, with the config rebuilt to match (the
    config is unsigned: an attacker writes the one the verifier expects); return its digest."""
    import hashlib

    def put(raw: bytes) -> dict[str, object]:
        h = hashlib.sha256(raw).hexdigest()
        (layout / "blobs" / "sha256" / h).write_bytes(raw)
        return {"digest": f"sha256:{h}", "size": len(raw)}

    top = json.loads((layout / "index.json").read_bytes())
    man = _manifest(layout)
    layers: list[dict[str, object]] = man["layers"]  # type: ignore[assignment]
    added = {**layer, **put(data)}
    layers.insert(at, added)
    cfg_desc: dict[str, str] = man["config"]  # type: ignore[assignment]
    cfg = json.loads(_blob(layout, cfg_desc["digest"]))
    cfg["modelfs"]["diffIds"] = [x["digest"] for x in layers]
    man["config"] = {"mediaType": CONFIG, **put(json.dumps(cfg, indent=2, sort_keys=True).encode())}
    top["manifests"][0].update(put(json.dumps(man, indent=2, sort_keys=True).encode()))
    (layout / "index.json").write_text(json.dumps(top))
    return str(added["digest"])


@pytest.mark.parametrize(("layer", "message"), [
    # typed as the signed index, so it was left out of the pin check
    ({"mediaType": "application/vnd.sovereign-gateway.airgap.index.v1+json",
      "annotations": {FILEPATH: "pytorch_model.bin"}},
     "the manifest must carry exactly one application/vnd.sovereign-gateway.airgap.index.v1+json"
     " layer, at .airgap/index.json; found layer 0 ("),
    # no file path, so it was keyed None and skipped
    ({"mediaType": WEIGHT}, f"layer 0 ({WEIGHT}, sha256:"),
    ({"mediaType": WEIGHT, "annotations": {}}, f"layer 0 ({WEIGHT}, sha256:"),
    ({"mediaType": WEIGHT, "annotations": {FILEPATH: "pytorch_model.bin"}},
     "('pytorch_model.bin') is not pinned by the signed lock"),
    ({"mediaType": DOC, "annotations": {FILEPATH: "README.md"}},
     "two layers share file path 'README.md'"),
])
def test_every_layer_is_pinned_or_the_artifact_fails(
    small: tuple[Lockfile, Path], keys: KeyPair, tmp_path: Path, layer: dict[str, object],
    message: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """Tester's finding 06: a layer the signed lock does not pin passed oci-verify (and was
    left out of the report) when typed as the signed index or carrying no file path."""
    _, bundle = small
    layout = export_oci(bundle, [keys.public], tmp_path / "oci")
    assert verify_oci(layout, [keys.public]).ok
    digest = _add_layer(layout, layer, _PICKLE)
    report = verify_oci(layout, [keys.public])
    assert not report.ok
    assert any(message in p.message for p in report.problems), report.problems
    assert all(p.code in ("pin_mismatch", "oci_invalid") for p in report.problems)
    capsys.readouterr()
    assert main(["oci-verify", str(layout), "--public-key", str(keys.public_path)]) == 1
    err = capsys.readouterr().err
    assert message in " ".join(err.split()) or digest[:19] in err, err
