"""Remains of killed runs: unpack resumes from them, pack removes them, a live run's are left
alone; a failed unpack removes every directory it created, parents included."""

from __future__ import annotations

import fcntl
import json
import os
import signal
from pathlib import Path

import pytest
from airgap_helpers import KeyPair, flip_byte, load_index, tree_state

from airgap import VerificationFailed, pack_bundle, unpack_bundle
from tests.weights.cli_util import run_interrupted
from weights import Lockfile


def test_unpack_resumes_after_a_kill(pristine_bundle: Path, keys: KeyPair,
                                     tmp_path: Path) -> None:
    store = tmp_path / "cache"
    res = run_interrupted("airgap.install", ("StagedFile",), "close", "SIGKILL", [
        "unpack", str(pristine_bundle), "--public-key", str(keys.public_path), "--into",
        str(store), "--workers", "1", "--quiet"], cli="airgap.cli")
    assert res.returncode == -signal.SIGKILL
    [left] = [p for p in store.iterdir()]  # nothing installed, only the dead run's staging
    assert left.name.startswith(".airgap-staging-")
    staged = sorted(p.name for p in left.iterdir() if p.name.startswith("blob-"))
    assert len(staged) == 2  # (beside the snapshot being built, tree-0)
    index = load_index(pristine_bundle)
    model_shas = {f["sha256"] for f in index["files"] if f["repo_id"] is not None}
    # only model blobs go into the store (the ML-BOM extra stays in the bundle without
    # --extras-into)
    blobs = {b["sha256"]: b["size"] for b in index["blobs"] if b["sha256"] in model_shas}
    resumed_bytes = sum(blobs[name.removeprefix("blob-")] for name in staged)
    report = unpack_bundle(pristine_bundle, [keys.public], store, workers=1)
    assert report.resumed == 2 and report.leftovers_removed == [left]
    assert report.bytes_written == sum(blobs.values()) - resumed_bytes
    assert not left.exists()
    clean = tmp_path / "clean"
    unpack_bundle(pristine_bundle, [keys.public], clean, workers=1)
    assert tree_state(store) == tree_state(clean)


def test_a_cut_short_staged_blob_is_not_reused(pristine_bundle: Path, keys: KeyPair,
                                               tmp_path: Path) -> None:
    store = tmp_path / "cache"
    left = store / ".airgap-staging-killed"
    left.mkdir(parents=True)
    blob = load_index(pristine_bundle)["blobs"][0]
    (left / f"blob-{blob['sha256']}").write_bytes(b"\0" * blob["size"])  # right size, wrong bytes
    report = unpack_bundle(pristine_bundle, [keys.public], store, workers=1)
    assert report.resumed == 0 and report.leftovers_removed == [left]
    clean = tmp_path / "clean"
    unpack_bundle(pristine_bundle, [keys.public], clean, workers=1)
    assert tree_state(store) == tree_state(clean)


def test_a_live_runs_staging_is_left_alone(pristine_bundle: Path, keys: KeyPair,
                                           tmp_path: Path) -> None:
    store = tmp_path / "cache"
    live = store / ".airgap-staging-live"
    live.mkdir(parents=True)
    (live / "blob-x").write_bytes(b"in progress")
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a concurrent unpack holds its own
        report = unpack_bundle(pristine_bundle, [keys.public], store, workers=1)
    finally:
        os.close(fd)
    assert report.leftovers_removed == []
    assert (live / "blob-x").read_bytes() == b"in progress"


def test_unpack_cli_reports_the_resume(pristine_bundle: Path, keys: KeyPair,
                                       tmp_path: Path) -> None:
    store = tmp_path / "cache"
    (store / ".airgap-staging-old").mkdir(parents=True)
    res = run_interrupted("airgap.install", ("StagedFile",), "close", "SIGINT", [
        "unpack", str(pristine_bundle), "--public-key", str(keys.public_path), "--into",
        str(store), "--json"], cli="airgap.cli", after=10**6)  # never interrupted
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["leftovers_removed"] == [str(store / ".airgap-staging-old")]
    assert doc["resumed"] == 0


def test_failed_unpack_removes_the_directories_it_created(bundle: Path, keys: KeyPair,
                                                          tmp_path: Path) -> None:
    part = load_index(bundle)["parts"][0]["name"]
    flip_byte(bundle / part, 10)  # found only while staging, after the store was created
    store = tmp_path / "new" / "deeper" / "cache"
    with pytest.raises(VerificationFailed):
        unpack_bundle(bundle, [keys.public], store, workers=1, extras_into=tmp_path / "x" / "y")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_pack_removes_a_killed_packs_partial_dir(small_model: Path, small_lock: Lockfile,
                                                 keys: KeyPair, tmp_path: Path) -> None:
    dead = tmp_path / ".tiny.bundle.k1ll3d.partial"
    dead.mkdir()
    (dead / "payload.000-of-009").write_bytes(b"half")
    report = pack_bundle(small_lock, small_model, tmp_path / "tiny.bundle", keys.private)
    assert report.leftovers_removed == (dead,)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.bundle"]
