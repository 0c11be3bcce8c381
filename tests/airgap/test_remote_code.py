"""Code that ``trust_remote_code`` runs (``modeling_*.py``, a config with ``auto_map``) is
refused by lock, pack and unpack unless the operator opts in with --allow-remote-code, and is
then marked as such in the lock, the signed index and the ML-BOM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airgap_helpers import KeyPair, lock_entry_from_dir, make_small_model, write_lock

from airgap import pack_bundle, unpack_bundle
from airgap.errors import VerificationFailed
from airgap.mlbom import BOM_NAME, read_extra
from airgap.validate import parse_index
from tests.weights.cli_util import run_cli
from weights import Lockfile, SerialisationPolicy
from weights.errors import RemoteCodeRefused
from weights.serialisation import check_format

REPO = "acme/custom-arch"
CODE = SerialisationPolicy(allow_remote_code=True)


def _model(root: Path) -> Path:
    src = make_small_model(root)
    (src / "config.json").write_text(json.dumps({
        "model_type": "custom", "auto_map": {"AutoModel": "modeling_custom.CustomModel"}}))
    (src / "modeling_custom.py").write_text("import os\nos.system('touch /tmp/never')\n")
    return src


def test_lock_refuses_remote_code_by_default_and_marks_it_when_allowed(tmp_path: Path) -> None:
    src = _model(tmp_path / "src")
    lock = tmp_path / "weights.lock"
    r = run_cli(["lock", str(src), "--repo-id", REPO, "--lock", str(lock), "-q"])
    assert r.returncode != 0
    assert "[remote_code]" in r.stderr and "--allow-remote-code" in r.stderr
    assert not lock.exists()
    r = run_cli(["lock", str(src), "--repo-id", REPO, "--lock", str(lock), "-q",
                 "--allow-remote-code"])
    assert r.returncode == 0, r.stderr
    files = {f.path: f for f in Lockfile.load(lock).entries[0].files}
    assert files["modeling_custom.py"].scan == "remote code accepted with --allow-remote-code"
    assert files["config.json"].scan == "remote code accepted with --allow-remote-code"
    assert files["tokenizer.json"].scan is None


def test_a_config_without_auto_map_and_other_json_are_data(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_text('{"model_type": "llama"}')
    assert check_format(f, "acme/m:config.json", SerialisationPolicy()).format == "data"
    f.write_text('{"auto_map": {"AutoTokenizer": ["x--tok.T", null]}}')
    with pytest.raises(RemoteCodeRefused, match="auto_map"):
        check_format(f, "acme/m:tokenizer_config.json", SerialisationPolicy())


def test_pack_and_unpack_require_the_opt_in_and_the_bom_says_code(
    tmp_path: Path, keys: KeyPair
) -> None:
    src = _model(tmp_path / "src")
    lock_path = tmp_path / "weights.lock"
    write_lock(lock_path, lock_entry_from_dir(src, REPO))
    bundle = tmp_path / "b"
    with pytest.raises(VerificationFailed, match="--allow-remote-code") as exc:
        pack_bundle(Lockfile.load(lock_path), src, bundle, keys.private)
    assert "remote_code" in exc.value.codes
    pack_bundle(Lockfile.load(lock_path), src, bundle, keys.private, policy=CODE)
    data = read_extra(bundle, parse_index((bundle / "index.json").read_bytes()), BOM_NAME)
    assert data is not None
    bom = json.loads(data)
    props = {p["name"]: p["value"] for p in bom["components"][0]["properties"]}
    assert "code" in props["sovereign-gateway:serialisation-formats"].split(",")
    store = tmp_path / "store"
    with pytest.raises(VerificationFailed, match="--allow-remote-code") as exc:
        unpack_bundle(bundle, [keys.public], store)
    assert exc.value.codes == {"remote_code"}
    assert not store.exists() or not any(store.rglob("*.py"))
    report = unpack_bundle(bundle, [keys.public], store, layout="dir", policy=CODE)
    assert (report.locations[REPO] / "modeling_custom.py").is_file()
