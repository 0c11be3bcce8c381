"""A SIGKILL at any point of ``unpack`` never leaves a part-written model where a loader looks.

The tester's finding 09: the install renamed file by file, so ``kill -9`` (or a power cut, the
OOM killer) after some renames left ``STORE/org/name`` with 5 of 13 files (``vllm serve DIR``
loads it), or a snapshot with 6 of 13 links (``--revision <commit>`` finds it). Now each model
directory or snapshot is built whole in staging and published by one rename, refs after it.

The CLI runs under ``strace``, which kills it (a real SIGKILL, by the kernel's rules: no
handler, no cleanup) at its Nth ``rename`` system call, for every N until a run completes.
After each kill the model is either absent or whole (the project's ``weights`` verify against
the signed lock), a ref names only a complete snapshot, and a re-run completes the store to
exactly what an uninterrupted unpack makes.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from airgap_helpers import KeyPair, tree_state

from airgap import unpack_bundle
from airgap.unpack import Layout
from tests.weights.cli_util import ROOT
from weights import Lockfile, hf_cache_paths, verify_tree

RENAMES = "rename,renameat,renameat2"


@pytest.fixture(scope="module")
def strace() -> str:
    found = shutil.which("strace")
    if found is None:
        pytest.fail("strace not installed: apt-get install strace (.ci/run does)")
    return found


def _killed_at(strace: str, n: int, args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``airgap ARGS``, killed by SIGKILL at its ``n``-th rename (if it gets that far)."""
    argv = [strace, "-f", "-qq", "-o", "/dev/null", "-e", f"trace={RENAMES}",
            "-e", f"inject={RENAMES}:signal=KILL:when={n}",
            sys.executable, "-m", "airgap.cli", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env["PYTHONPATH"] = str(ROOT)
    # The CLI's own renames only: a Python that writes bytecode renames each new .pyc into
    # place, which would move every kill point by the modules compiled since the last run.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120, check=False)


def _was_killed(res: subprocess.CompletedProcess[str]) -> bool:
    # strace ends by the signal that killed its tracee (a shell sees 137)
    return res.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)


@pytest.mark.parametrize("layout", ["dir", "hf-cache"])
def test_a_kill_at_any_rename_leaves_each_model_absent_or_whole(
    pristine_bundle: Path, small_lock: Lockfile, keys: KeyPair, tmp_path: Path, layout: Layout,
    strace: str,
) -> None:
    entry = small_lock.entries[0]
    clean = tmp_path / "clean"
    unpack_bundle(pristine_bundle, [keys.public], clean, layout=layout)
    killed_states = 0
    for n in range(1, 200):
        store = tmp_path / f"store-{n}"
        res = _killed_at(strace, n, ["unpack", str(pristine_bundle), "--public-key",
                                     str(keys.public_path), "--into", str(store), "--layout",
                                     layout, "--quiet"])
        if not _was_killed(res):  # fewer than n renames: it ran to the end
            assert res.returncode == 0, res.stderr
            assert tree_state(store) == tree_state(clean)
            break
        if layout == "dir":
            model = store / entry.repo_id
            ref = None
        else:
            paths = hf_cache_paths(store, entry.repo_id)
            model, ref = paths.snapshot(entry.commit), paths.refs / entry.requested_revision
        if model.exists():  # published: then whole, exactly the bundle's files
            report = verify_tree(model, entry)
            assert not (report.mismatched or report.missing or report.extra
                        or report.missing_shards), f"killed at rename {n}: {report}"
            # A kill between the snapshot's publication and its ref's leaves the ref absent
            # (a loader asking for the revision finds nothing), never naming anything else.
            assert all(r.actual == "absent" for r in report.refs), f"killed at rename {n}"
            killed_states += 1
        else:
            assert ref is None or not ref.exists(), f"killed at rename {n}: ref before snapshot"
        # The next run completes it (resuming the dead run's staged blobs).
        unpack_bundle(pristine_bundle, [keys.public], store, layout=layout)
        assert tree_state(store) == tree_state(clean), f"killed at rename {n}"
    else:
        pytest.fail("unpack never completed under strace")
    # A kill at every rename of the run: one per file at least, then the publication (the
    # snapshot's is followed by the ref's, so a kill there finds it published and whole).
    assert n > len(entry.files)
    assert killed_states == (0 if layout == "dir" else 1)
