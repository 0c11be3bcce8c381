"""Two models of one bundle that would install to one path are refused by pack, verify and
unpack, naming both (the lockfile rule of :mod:`weights.installpaths`, in both layouts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airgap_helpers import (
    REPO,
    KeyPair,
    load_index,
    lock_entry_from_dir,
    resign,
    tree_state,
    write_lock,
)

from airgap import Code, StoreError, VerificationFailed, pack_bundle, unpack_bundle, verify_bundle
from airgap.cli import main
from airgap.unpack import Layout

# REPO is "acme/tiny-model": a namespace-less model "acme" holding a file "tiny-model" would be
# a file where the dir layout needs REPO's directory; "ACME/Tiny-Model" is REPO on a
# case-insensitive file system (and on the Hub).
TWINS = {"file over a model dir": ("acme", "tiny-model"),
         "repo id differing in case": ("ACME/Tiny-Model", "config.json")}


@pytest.mark.parametrize("twin", TWINS.values(), ids=TWINS.keys())
@pytest.mark.parametrize("layout", ["hf-cache", "dir"])
def test_signed_index_with_colliding_models_is_refused(
    bundle: Path, keys: KeyPair, tmp_path: Path, twin: tuple[str, str], layout: Layout
) -> None:
    repo_id, path = twin
    doc = load_index(bundle)
    model = doc["lock"]["models"][0]
    pinned = dict(next(f for f in model["files"] if f["path"] == "config.json"), path=path)
    doc["lock"]["models"].append(dict(model, repo_id=repo_id, files=[pinned]))
    carried = next(f for f in doc["files"] if f["path"] == "config.json")
    doc["files"].append(dict(carried, repo_id=repo_id, path=path))
    resign(bundle, doc, keys.private)
    report = verify_bundle(bundle, [keys.public])
    [problem] = [p for p in report.problems if p.code == Code.PATH_COLLISION]
    assert repo_id in problem.message and REPO in problem.message
    store = tmp_path / "store"
    store.mkdir()
    with pytest.raises(VerificationFailed) as info:
        unpack_bundle(bundle, [keys.public], store, layout=layout)
    assert Code.PATH_COLLISION in info.value.codes
    assert tree_state(store) == {}


def test_pack_refuses_a_colliding_lockfile(small_model: Path, keys: KeyPair, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    entry = {"requested_revision": "main", "commit": "b" * 40, "files": [
        {"path": "tiny-model", "size": 1, "sha256": "1" * 64, "git_sha1": "1" * 40,
         "lfs": False}]}
    other = dict(entry, repo_id=REPO, files=[dict(entry["files"][0], path="config.json")])
    lock = tmp_path / "weights.lock"
    lock.write_text(json.dumps({"version": 1, "models": [dict(entry, repo_id="acme"), other]}))
    rc = main(["pack", "--lock", str(lock), "--from", str(small_model), "--out",
               str(tmp_path / "out"), "--key", str(keys.private_path)])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"airgap: error [path_collision]: {lock}: acme:tiny-model and {REPO}:config.json" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layout", ["hf-cache", "dir"])
@pytest.mark.parametrize("twin", ["ACME/Tiny-Model", "acme/TINY-model"])
def test_unpack_refuses_a_model_the_store_holds_under_another_spelling(
    bundle: Path, small_model: Path, keys: KeyPair, tmp_path: Path, store: Path,
    layout: Layout, twin: str,
) -> None:
    # Each bundle alone is sound; together they would put one Hub repository in the store
    # twice (Linux), or merge two folders into one (a case-folding disk).
    unpack_bundle(bundle, [keys.public], store, layout=layout)
    lock = write_lock(tmp_path / "twin.lock", lock_entry_from_dir(small_model, twin))
    other = tmp_path / "twin.bundle"
    pack_bundle(lock, small_model, other, keys.private)
    before = tree_state(store)
    with pytest.raises(StoreError) as info:
        unpack_bundle(other, [keys.public], store, layout=layout)
    assert info.value.code == Code.STORE_CONFLICT
    assert f"{twin} would install to" in str(info.value) and "the store holds" in str(info.value)
    assert tree_state(store) == before
