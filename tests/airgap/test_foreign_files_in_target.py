"""After ``unpack``, a model's directory holds exactly the bundle's files, or unpack fails.

A model directory (``dir`` layout) or snapshot (``hf-cache``) that already holds what the
bundle does not carry (a pickle a loader unpickles, a ``modeling_*.py`` it imports under
``trust_remote_code``, a stray shard it loads, a symlink where the bundle has a file) made
unpack exit 0 with them in place (tester's finding 01). Now it is refused naming every one
(``store_conflict``, the store unchanged), or with ``--replace`` the directory is replaced
whole; the oracle for "exactly the bundle's files" is the project's own ``weights`` verify
against the signed lock.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from airgap_helpers import REPO, KeyPair, tree_state

from airgap import StoreError, unpack_bundle
from airgap.cli import main
from airgap.errors import Code
from airgap.unpack import Layout
from weights import Lockfile, hf_cache_paths, verify_tree

# A pickle whose loading runs `id` (os.system): what a loader's torch.load would execute.
PICKLE = (b"\x80\x04\x95\x15\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93\x8c\x02id"
          b"\x85R.")


def _model_dir(store: Path, layout: Layout, lock: Lockfile) -> Path:
    entry = lock.entries[0]
    if layout == "dir":
        return store / entry.repo_id
    return hf_cache_paths(store, entry.repo_id).snapshot(entry.commit)


def _plant(model: Path, outside: Path) -> list[str]:
    """Put foreign entries in ``model``; returns their names as a refusal lists them."""
    model.mkdir(parents=True, exist_ok=True)
    (model / "pytorch_model.bin").write_bytes(PICKLE)
    (model / "modeling_evil.py").write_text('import os; os.system("id")\n')
    (model / "model-00002-of-00002.safetensors").write_bytes(os.urandom(64))
    (model / "extra").mkdir()
    (model / "extra" / "x.py").write_text("pass\n")
    outside.write_text('import os; os.system("id")\n')
    (model / "configuration_evil.py").symlink_to(outside)  # a foreign symlink, too
    return ["configuration_evil.py", "extra/", "model-00002-of-00002.safetensors",
            "modeling_evil.py", "pytorch_model.bin"]


def _planted_store(tmp_path: Path, layout: Layout, lock: Lockfile
                   ) -> tuple[Path, Path, list[str]]:
    """A store whose model directory holds the foreign entries of :func:`_plant`: the store,
    the model directory and the names planted."""
    store = tmp_path / "store"
    model = _model_dir(store, layout, lock)
    return store, model, _plant(model, tmp_path / "evil.py")


@pytest.mark.parametrize("layout", ["dir", "hf-cache"])
def test_foreign_files_in_the_model_directory_are_refused_and_named(
    pristine_bundle: Path, small_lock: Lockfile, keys: KeyPair, tmp_path: Path, layout: Layout
) -> None:
    store, model, planted = _planted_store(tmp_path, layout, small_lock)
    before = tree_state(store)
    with pytest.raises(StoreError) as info:
        unpack_bundle(pristine_bundle, [keys.public], store, layout=layout)
    assert info.value.code == Code.STORE_CONFLICT
    assert list(info.value.paths) == planted
    assert f"{model} (" in info.value.message
    for name in planted:
        assert name in info.value.message
    assert tree_state(store) == before  # nothing written, nothing removed


@pytest.mark.parametrize("layout", ["dir", "hf-cache"])
def test_replace_installs_exactly_the_bundles_files(
    pristine_bundle: Path, small_lock: Lockfile, keys: KeyPair, tmp_path: Path, layout: Layout
) -> None:
    store, model, planted = _planted_store(tmp_path, layout, small_lock)
    report = unpack_bundle(pristine_bundle, [keys.public], store, layout=layout, replace=True)
    assert report.replaced == {REPO: planted}
    assert verify_tree(model, small_lock.entries[0]).ok  # no extra, missing or other file
    clean = tmp_path / "clean"
    unpack_bundle(pristine_bundle, [keys.public], clean, layout=layout)
    assert tree_state(store) == tree_state(clean)
    assert (tmp_path / "evil.py").exists()  # a symlink's target is never touched


@pytest.mark.parametrize("layout", ["dir", "hf-cache"])
@pytest.mark.parametrize("how", ["file", "directory"])
def test_a_symlink_where_the_bundle_has_a_file_or_directory_is_refused(
    pristine_bundle: Path, small_lock: Lockfile, keys: KeyPair, tmp_path: Path, layout: Layout,
    how: str,
) -> None:
    # A model installed, then one of its files (or its sub-directory) swapped for a symlink
    # to something else a loader would read through it.
    store = tmp_path / "store"
    unpack_bundle(pristine_bundle, [keys.public], store, layout=layout)
    model = _model_dir(store, layout, small_lock)
    name = "config.json" if how == "file" else "1_Pooling"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / name  # the same bytes, reached through a link
    if how == "file":
        target.write_bytes((model / name).read_bytes())
        (model / name).unlink()
    else:
        shutil.copytree(model / name, target)
        shutil.rmtree(model / name)
    os.symlink(target, model / name)
    before = tree_state(store)
    with pytest.raises(StoreError) as info:
        unpack_bundle(pristine_bundle, [keys.public], store, layout=layout)
    assert info.value.code == Code.STORE_CONFLICT
    assert list(info.value.paths) == [name]
    assert tree_state(store) == before
    unpack_bundle(pristine_bundle, [keys.public], store, layout=layout, replace=True)
    assert Path(os.path.realpath(model / name)).is_relative_to(store.resolve())
    assert verify_tree(model, small_lock.entries[0]).ok


@pytest.mark.parametrize("layout", ["dir", "hf-cache"])
def test_a_model_directory_holding_part_of_the_bundle_is_completed(
    pristine_bundle: Path, small_lock: Lockfile, keys: KeyPair, tmp_path: Path, layout: Layout
) -> None:
    # What an earlier release's killed unpack left (some of the files, as in the bundle):
    # nothing foreign, so it is completed without --replace.
    store = tmp_path / "store"
    unpack_bundle(pristine_bundle, [keys.public], store, layout=layout)
    model = _model_dir(store, layout, small_lock)
    (model / "config.json").unlink()
    (model / "1_Pooling" / "config.json").unlink()
    report = unpack_bundle(pristine_bundle, [keys.public], store, layout=layout)
    assert report.replaced == {}
    assert verify_tree(model, small_lock.entries[0]).ok
    clean = tmp_path / "clean"
    unpack_bundle(pristine_bundle, [keys.public], clean, layout=layout)
    assert tree_state(store) == tree_state(clean)


def test_cli_names_the_foreign_files_and_replace_removes_them(
    pristine_bundle: Path, small_lock: Lockfile, keys: KeyPair, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = tmp_path / "store"
    model = _model_dir(store, "dir", small_lock)
    planted = _plant(model, tmp_path / "evil.py")
    args = ["unpack", str(pristine_bundle), "--public-key", str(keys.public_path), "--into",
            str(store), "--layout", "dir", "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"airgap: error [store_conflict]: {model} (the directory of model "
                          f"{REPO}) already holds files the bundle does not carry: "
                          f"{', '.join(planted)}; "), err
    assert "rerun with --replace" in err
    assert (model / "pytorch_model.bin").exists()
    assert main([*args, "--replace"]) == 0
    captured = capsys.readouterr()
    assert (f"replaced {model} whole (--replace), removing 5 entries the bundle does not carry "
            f"or carries otherwise: {', '.join(planted)}") in captured.err
    assert verify_tree(model, small_lock.entries[0]).ok
