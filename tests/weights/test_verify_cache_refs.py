"""weights verify on a Hugging Face cache checks what a loader resolving the repo id reads:
its refs and snapshots, not only the pinned commit's snapshot (tester's finding 10: refs/main
pointed at a second snapshot with a tampered config.json and modeling_evil.py, and verify said
OK on the cache root, the repo directory and the snapshot)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.weights.cli_util import run_cli
from tests.weights.test_weights_verify import lock_dir, sharded_dir  # noqa: F401 - fixture
from weights import LockEntry, Lockfile, Mismatch, install_hf_cache, verify_tree

EVIL = "f" * 40


def _loader_resolves(cache: Path, repo_id: str) -> Path:
    """The snapshot huggingface_hub (vLLM's loader) reads for ``repo_id`` offline."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))


@pytest.fixture
def cached(sharded_dir: Path, tmp_path: Path) -> tuple[Path, LockEntry]:  # noqa: F811
    entry = lock_dir(sharded_dir)
    cache = tmp_path / "cache"
    install_hf_cache(cache, entry, {f.path: sharded_dir / f.path for f in entry.files})
    return cache, entry


def _tamper(repo: Path, commit: str) -> None:
    """A second snapshot with a remote-code config, and refs/main pointing at it."""
    evil = repo / "snapshots" / EVIL
    shutil.copytree(repo / "snapshots" / commit, evil, symlinks=False)
    (evil / "config.json").unlink()
    (evil / "config.json").write_text('{"auto_map": {"AutoModel": "modeling_evil.Evil"}}')
    (evil / "modeling_evil.py").write_text("import os; os.system('id')\n")
    (repo / "refs" / "main").write_text(EVIL)


def test_ref_moved_to_another_snapshot_fails_for_every_form_of_the_path(
        cached: tuple[Path, LockEntry]) -> None:
    cache, entry = cached
    repo = cache / "models--org--model"
    assert verify_tree(cache, entry).ok
    _tamper(repo, entry.commit)
    assert _loader_resolves(cache, entry.repo_id).name == EVIL  # what would be served
    for where in (cache, repo, repo / "snapshots" / entry.commit):
        r = verify_tree(where, entry)
        assert not r.ok, where
        assert r.refs == (Mismatch("refs/main", f"commit:{entry.commit}", f"commit:{EVIL}"),)
        assert r.extra_snapshots == (f"snapshots/{EVIL}",)
        # the pinned snapshot itself is intact
        assert (r.mismatched, r.missing, r.extra) == ((), (), ())


def test_other_refs_and_a_missing_ref_fail_a_stale_snapshot_is_listed(
        cached: tuple[Path, LockEntry]) -> None:
    cache, entry = cached
    repo = cache / "models--org--model"
    _tamper(repo, entry.commit)
    # main restored, the snapshot stays (as an update leaves the previous commit's): listed,
    # not failed, since no ref leads there
    (repo / "refs" / "main").write_text(entry.commit)
    r = verify_tree(cache, entry)
    assert r.ok and r.refs == ()
    assert r.extra_snapshots == (f"snapshots/{EVIL}",)
    assert _loader_resolves(cache, entry.repo_id).name == entry.commit
    shutil.rmtree(repo / "snapshots" / EVIL)
    (repo / "refs" / "pr").mkdir()
    (repo / "refs" / "pr" / "1").write_text(EVIL)  # a revision someone may load by name
    (repo / "refs" / "main").write_text(entry.commit + "\n")  # a loader reads it as is
    assert verify_tree(cache, entry).refs == (
        Mismatch("refs/main", f"commit:{entry.commit}", f"commit:{entry.commit}\n"),
        Mismatch("refs/pr/1", f"commit:{entry.commit}", f"commit:{EVIL}"),
    )
    (repo / "refs" / "pr" / "1").unlink()
    (repo / "refs" / "main").unlink()  # loading by repo id finds no revision main
    assert verify_tree(cache, entry).refs == (
        Mismatch("refs/main", f"commit:{entry.commit}", "absent"),)
    (repo / "refs" / "main").write_text(entry.commit)
    assert verify_tree(cache, entry).ok
    assert _loader_resolves(cache, entry.repo_id).name == entry.commit


def test_cli_names_the_ref_and_the_snapshot_and_exits_1(
        cached: tuple[Path, LockEntry], tmp_path: Path) -> None:
    cache, entry = cached
    lock = tmp_path / "weights.lock"
    Lockfile((entry,)).save(lock)
    _tamper(cache / "models--org--model", entry.commit)
    text = run_cli(["verify", str(cache), "--lock", str(lock)])
    assert text.returncode == 1, text.stderr
    assert f"REF      refs/main: names '{EVIL}', the lock pins {entry.commit}" in text.stdout
    assert f"NOTE     other snapshot snapshots/{EVIL}: no ref names it" in text.stdout
    assert "OK " not in text.stdout
    doc = json.loads(run_cli(["verify", str(cache), "--lock", str(lock), "--json"]).stdout)
    assert doc["ok"] is False
    assert doc["lock"]["refs"] == [{"path": "refs/main", "expected": f"commit:{entry.commit}",
                                    "actual": f"commit:{EVIL}"}]
    assert doc["lock"]["extra_snapshots"] == [f"snapshots/{EVIL}"]
