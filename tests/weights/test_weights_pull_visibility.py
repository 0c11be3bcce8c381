"""An interrupted or killed ``weights pull`` never leaves a model that loads with files missing;
the next run reports what the killed one left and resumes from it.

The child is stopped at a known point (after the n-th verified download) by a signal it sends
itself; SIGKILL gives no chance to clean up, as a power cut or the OOM killer would not.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.hub_fixtures import SHARDED, HubServer
from tests.weights.cli_util import run_cli, run_interrupted
from tests.weights.test_weights_pull import _pinned
from weights import Lockfile, hf_cache_paths, verify_tree


def _kill_after_two_downloads(sig: str, args: list[str], endpoint: str) -> None:
    res = run_interrupted("weights.pull", (), "_verify_staged", sig, ["pull", *args],
                          endpoint=endpoint)
    # SIGKILL cannot be handled: the process dies by it; SIGTERM is handled: exit 128 + 15.
    expected = -signal.SIGKILL if sig == "SIGKILL" else 128 + getattr(signal, sig)
    assert res.returncode == expected, res.stderr


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_killed_pull_into_a_new_dir_shows_nothing_then_resumes(
    hub_server: HubServer, tmp_path: Path, sig: str
) -> None:
    lock = _pinned(hub_server, tmp_path, SHARDED)
    entry = Lockfile.load(lock).entry(SHARDED)
    dest = tmp_path / "models" / "tiny"
    _kill_after_two_downloads(sig, ["--lock", str(lock), "--into", str(dest), "-q"],
                              hub_server.url)
    assert not dest.exists()  # not a directory with some of the files
    staging = tmp_path / "models" / ".tiny.weights-staging"
    assert staging.is_dir()
    before = len(hub_server.hub.requests)
    res = run_cli(["pull", "--lock", str(lock), "--into", str(dest), "-q"],
                  endpoint=hub_server.url)
    assert res.returncode == 0, res.stderr
    left = 2  # one file placed, one verified (after SIGKILL still a .part)
    assert (f"{SHARDED}: resumed {left} file(s) left by an earlier run that did not finish"
            in res.stderr)
    assert verify_tree(dest, entry).ok
    assert not staging.exists()
    # What the killed run had verified was not downloaded again.
    again = {q.path.rsplit("/", 1)[-1] for q in hub_server.hub.requests[before:]
             if "/resolve/" in q.path and q.method == "GET"}
    first_two = {f.path for f in entry.files[:2]}  # pulled in this order, before the kill
    assert first_two == {"README.md", "config.json"} and not again & first_two


def test_killed_pull_into_the_cache_publishes_no_snapshot(hub_server: HubServer,
                                                          tmp_path: Path) -> None:
    lock = _pinned(hub_server, tmp_path, SHARDED)
    entry = Lockfile.load(lock).entry(SHARDED)
    cache = tmp_path / "hub"
    _kill_after_two_downloads("SIGKILL", ["--lock", str(lock), "--cache", str(cache), "-q"],
                              hub_server.url)
    paths = hf_cache_paths(cache, SHARDED)
    # Loading by commit (or by ref) finds nothing, rather than a snapshot with files missing.
    assert not paths.snapshot(entry.commit).exists()
    assert not paths.refs.exists()
    res = run_cli(["pull", "--lock", str(lock), "--cache", str(cache), "-q"],
                  endpoint=hub_server.url)
    assert res.returncode == 0, res.stderr
    assert "resumed 1 file(s)" in res.stderr
    snap = paths.snapshot(entry.commit)
    assert sorted(p.relative_to(snap).as_posix() for p in snap.rglob("*")
                  if p.is_symlink()) == sorted(f.path for f in entry.files)
    assert verify_tree(snap, entry).ok
    assert paths.read_ref("main") == entry.commit
    assert not (cache / ".weights-staging").exists()


def test_an_existing_incomplete_snapshot_is_replaced_whole(hub_server: HubServer,
                                                           tmp_path: Path) -> None:
    lock = _pinned(hub_server, tmp_path, SHARDED)
    entry = Lockfile.load(lock).entry(SHARDED)
    cache = tmp_path / "hub"
    snap = hf_cache_paths(cache, SHARDED).snapshot(entry.commit)
    snap.mkdir(parents=True)  # what an older tool left: a snapshot with one foreign file
    os.symlink("../../blobs/elsewhere", snap / "other.txt")
    res = run_cli(["pull", "--lock", str(lock), "--cache", str(cache), "-q"],
                  endpoint=hub_server.url)
    assert res.returncode == 0, res.stderr
    assert verify_tree(snap, entry, ignore=["other.txt"]).ok
    assert os.readlink(snap / "other.txt") == "../../blobs/elsewhere"  # kept
