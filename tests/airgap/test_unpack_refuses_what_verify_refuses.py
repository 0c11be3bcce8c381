"""``unpack`` refuses every bundle ``verify`` refuses, extras installed or not; ``oci-verify``
refuses an artifact whose config or layer media types were edited after export."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from airgap_helpers import (
    KeyPair,
    lock_entry_from_dir,
    make_small_model,
    rewrite_bom,
    write_lock,
)

from airgap import pack_bundle, unpack_bundle, verify_bundle
from airgap.errors import VerificationFailed
from airgap.mlbom import BOM_NAME
from airgap.oci import export_oci, verify_oci
from airgap.validate import parse_index

REPO = "acme/tiny"


@pytest.fixture
def bundle(tmp_path: Path, keys: KeyPair) -> Path:
    src = make_small_model(tmp_path / "src")
    (src / "README.md").write_text("---\nlicense: mit\n---\n# tiny\n")
    lock = write_lock(tmp_path / "weights.lock", lock_entry_from_dir(src, REPO, license="mit"))
    out = tmp_path / "b"
    pack_bundle(lock, src, out, keys.private)
    return out


def _lie_about_a_hash(doc: dict[str, object]) -> None:
    model = doc["components"][0]  # type: ignore[index]
    model["components"][0]["hashes"][0]["content"] = "0" * 64


def test_unpack_refuses_a_doctored_bom_without_extras_into(
    bundle: Path, keys: KeyPair, tmp_path: Path
) -> None:
    rewrite_bom(bundle, keys.private, _lie_about_a_hash)
    assert [p.code for p in verify_bundle(bundle, [keys.public]).problems] == ["mlbom_mismatch"]
    store = tmp_path / "store"
    with pytest.raises(VerificationFailed) as exc:
        unpack_bundle(bundle, [keys.public], store)
    assert exc.value.codes == {"mlbom_mismatch"}
    assert not store.exists()


def test_unpack_refuses_a_damaged_part_holding_only_extras(
    bundle: Path, keys: KeyPair, tmp_path: Path
) -> None:
    index = parse_index((bundle / "index.json").read_bytes())
    bom = next(f for f in index.extras if f.path == BOM_NAME)
    blob = next(b for b in index.blobs if b.sha256 == bom.sha256)
    seg = next(iter(index.segments(blob.offset, blob.stored_size)))
    part = bundle / seg.part.name
    data = bytearray(part.read_bytes())
    data[seg.start + 10] ^= 0x20
    part.write_bytes(bytes(data))
    verified = verify_bundle(bundle, [keys.public])
    assert not verified.ok
    store = tmp_path / "store"
    with pytest.raises(VerificationFailed) as exc:
        unpack_bundle(bundle, [keys.public], store)
    assert exc.value.codes == {p.code for p in verified.problems}
    assert not store.exists()


def _edit_config(layout: Path, edit: Callable[[dict[str, object]], None],
                 layer_edit: Callable[[list[dict[str, object]]], None] | None = None) -> None:
    """Edit the config (and layers) and re-link manifest and index by digest, as anyone with
    write access to a registry can: no signature covers the config or the manifest."""
    top = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    manifest = json.loads((blobs / top["manifests"][0]["digest"].split(":")[1]).read_bytes())
    config = json.loads((blobs / manifest["config"]["digest"].split(":")[1]).read_bytes())
    edit(config)
    if layer_edit is not None:
        layer_edit(manifest["layers"])

    def put(doc: object) -> dict[str, object]:
        data = json.dumps(doc, indent=2, sort_keys=True).encode()
        sha = hashlib.sha256(data).hexdigest()
        (blobs / sha).write_bytes(data)
        return {"digest": f"sha256:{sha}", "size": len(data)}

    manifest["config"].update(put(config))
    top["manifests"][0].update(put(manifest))
    (layout / "index.json").write_text(json.dumps(top))


def _licence(c: dict[str, object]) -> None:
    c["descriptor"]["licenses"] = ["apache-2.0"]  # type: ignore[index]


def _format(c: dict[str, object]) -> None:
    c["config"]["format"] = "safetensors"  # type: ignore[index]


def _keep(c: dict[str, object]) -> None:
    return None


def _media(layers: list[dict[str, object]]) -> None:
    for x in layers:
        if x["annotations"]["org.cncf.model.filepath"] == "config.json":  # type: ignore[index]
            x["mediaType"] = "application/vnd.cncf.model.weight.v1.raw"


@pytest.mark.parametrize(("edit", "layer_edit"), [(_licence, None), (_format, None),
                                                  (_keep, _media)],
                         ids=["licence", "format", "layer_media_type"])
def test_oci_verify_refuses_an_edited_config_or_media_type(
    bundle: Path, keys: KeyPair, tmp_path: Path,
    edit: Callable[[dict[str, object]], None],
    layer_edit: Callable[[list[dict[str, object]]], None] | None,
) -> None:
    layout = export_oci(bundle, [keys.public], tmp_path / "oci")
    assert verify_oci(layout, [keys.public]).ok
    _edit_config(layout, edit, layer_edit)
    report = verify_oci(layout, [keys.public])
    assert not report.ok
    assert {p.code for p in report.problems} == {"oci_invalid"}
