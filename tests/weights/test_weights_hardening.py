"""Regressions found by trying the weights CLI as a new operator (each test failed first)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hub_emulator import make_sharded
from tests.weights.cli_util import run_cli
from tests.weights.test_weights_verify import lock_dir
from weights import LockEntry, Lockfile, install_hf_cache


def _model(root: Path, tag: str) -> Path:
    root.mkdir(parents=True)
    files = make_sharded([{"a": ("BF16", (16, 16))}, {"b": ("F32", (8,))}])
    files["config.json"] = json.dumps({"model_type": "llama", "tag": tag}).encode() + b"\n"
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


@pytest.fixture
def two_models(tmp_path: Path) -> tuple[Path, Path, list[LockEntry]]:
    """A plain multi-model directory (``DIR/org/name`` as ``pull --into`` writes it), the
    matching lock and its entries."""
    plain = tmp_path / "models"
    entries = [lock_dir(_model(plain / repo, repo), repo, c * 40)
               for repo, c in (("org/alpha", "a"), ("org/beta", "b"))]
    lock = tmp_path / "weights.lock"
    Lockfile(tuple(entries)).save(lock)
    return plain, lock, entries


def test_verify_multi_model_plain_root_checks_every_model(
    two_models: tuple[Path, Path, list[LockEntry]],
) -> None:
    plain, lock, _ = two_models
    ok = run_cli(["verify", str(plain), "--lock", str(lock), "--json"])
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert [m["repo_id"] for m in doc["models"]] == ["org/alpha", "org/beta"]
    # Damage only the SECOND model: a root verify must not stop at the first one.
    (plain / "org/beta/config.json").write_bytes(b'{"model_type": "llamb"}\n')
    bad = run_cli(["verify", str(plain), "--lock", str(lock)])
    assert bad.returncode == 1, bad.stderr
    assert "org/beta: MISMATCH config.json" in bad.stderr
    assert "OK org/alpha" in bad.stderr


def test_verify_multi_model_cache_root_checks_every_model(
    two_models: tuple[Path, Path, list[LockEntry]], tmp_path: Path,
) -> None:
    plain, lock, entries = two_models
    cache = tmp_path / "cache"
    for e in entries:
        install_hf_cache(cache, e, {f.path: plain / e.repo_id / f.path for f in e.files})
    assert run_cli(["verify", str(cache), "--lock", str(lock)]).returncode == 0
    blob = cache / "models--org--beta" / "blobs" / entries[1].file("config.json").blob_id
    blob.write_bytes(b'{"model_type": "llamb"}\n')
    bad = run_cli(["verify", str(cache), "--lock", str(lock), "--json"])
    assert bad.returncode == 1, bad.stderr
    beta = json.loads(bad.stdout)["models"][1]
    assert beta["repo_id"] == "org/beta" and beta["mismatched"][0]["path"] == "config.json"


def test_verify_root_with_a_pinned_model_absent_fails(
    two_models: tuple[Path, Path, list[LockEntry]],
) -> None:
    plain, lock, entries = two_models
    for f in entries[1].files:
        (plain / "org/beta" / f.path).unlink()
    (plain / "org/beta").rmdir()
    bad = run_cli(["verify", str(plain), "--lock", str(lock), "--json"])
    assert bad.returncode == 1, bad.stderr
    beta = json.loads(bad.stdout)["models"][1]
    assert beta["missing"] == sorted(f.path for f in entries[1].files)


def test_verify_plain_model_dir_is_picked_by_its_org_name_path(
    two_models: tuple[Path, Path, list[LockEntry]],
) -> None:
    plain, lock, _ = two_models
    res = run_cli(["verify", str(plain / "org/beta"), "--lock", str(lock), "--json"])
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["lock"]["repo_id"] == "org/beta"


@pytest.mark.parametrize("revision", ["../../escape", "/abs", "a/../../b", "x\\y", ""])
def test_lock_with_unsafe_requested_revision_is_refused_before_any_write(
    two_models: tuple[Path, Path, list[LockEntry]], tmp_path: Path, revision: str,
) -> None:
    _, lock, _ = two_models
    doc = json.loads(lock.read_text())
    doc["models"][1]["requested_revision"] = revision
    lock.write_text(json.dumps(doc))
    cache = tmp_path / "deep" / "cache"
    res = run_cli(["pull", "--lock", str(lock), "--cache", str(cache)])
    assert res.returncode == 2, res.stderr
    assert "error [lockfile_invalid]" in res.stderr
    assert "$.models[1].requested_revision: unsafe revision" in res.stderr
    assert "Traceback" not in res.stderr
    assert not (tmp_path / "deep").exists()
