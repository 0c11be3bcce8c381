"""SIGTERM / SIGHUP / Ctrl-C in the middle of pack or unpack leaves nothing half-written.

The CLI runs in a child process; a real signal is sent to it by the process itself at a known
point (after the second part file, or after the second staged blob; sent to the main thread,
as a terminal's Ctrl-C or ``kill`` reaches a single-threaded tool), so the test is
deterministic without timing. The destination must then be exactly as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from airgap_helpers import KeyPair, tree_state

from weights import Lockfile

ROOT = Path(__file__).resolve().parents[2]

# Deliver ``SIG`` to ourselves right after the second call of ``OWNER.ATTR``, then go on as
# usual: the CLI's own signal handling must stop the command and clean up.
_WRAPPER = """
import importlib, signal, sys, threading
owner = importlib.import_module({module!r})
for name in {path!r}:
    owner = getattr(owner, name)
original = getattr(owner, {attr!r})
calls = []
def hooked(*a, **k):
    result = original(*a, **k)
    calls.append(1)
    if len(calls) == 2:
        signal.pthread_kill(threading.main_thread().ident, signal.{sig})
    return result
setattr(owner, {attr!r}, hooked)
from airgap.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _run_interrupted(
    module: str, owner: tuple[str, ...], attr: str, sig: str, args: list[str]
) -> subprocess.CompletedProcess[str]:
    code = _WRAPPER.format(module=module, path=owner, attr=attr, sig=sig)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_pack_interrupted_leaves_no_partial_bundle(
    small_model: Path, small_lock: Lockfile, keys: KeyPair, tmp_path: Path, sig: str
) -> None:
    lock = tmp_path / "weights.lock"
    small_lock.save(lock)
    usb = tmp_path / "usb"
    usb.mkdir()
    (usb / "keep.txt").write_text("operator file\n")
    before = tree_state(usb)
    res = _run_interrupted("airgap.payload", ("PartWriter",), "_close_part", sig, [
        "pack", "--lock", str(lock), "--from", str(small_model), "--out", str(usb / "bundle"),
        "--key", str(keys.private_path), "--part-size", "16384", "--quiet"])
    # Ended by the same signal (as seen by a shell: 128 + N), after cleaning up.
    assert res.returncode == -getattr(signal, sig), res.stderr
    assert f"error: interrupted by {sig}; partial output was removed" in res.stderr
    assert "Traceback" not in res.stderr
    assert tree_state(usb) == before  # no bundle, no .bundle.*.partial directory


@pytest.mark.parametrize(("sig", "workers"), [("SIGTERM", "1"), ("SIGINT", "1"),
                                             ("SIGTERM", "2")])
def test_unpack_interrupted_leaves_store_unchanged(
    pristine_bundle: Path, keys: KeyPair, tmp_path: Path, sig: str, workers: str
) -> None:
    store = tmp_path / "cache"
    store.mkdir()
    (store / "models--other--model").mkdir()
    before = tree_state(store)
    res = _run_interrupted("airgap.unpack", ("_StagedFile",), "close", sig, [
        "unpack", str(pristine_bundle), "--public-key", str(keys.public_path), "--into",
        str(store), "--workers", workers, "--quiet"])
    # Ended by the same signal (as seen by a shell: 128 + N), after cleaning up.
    assert res.returncode == -getattr(signal, sig), res.stderr
    assert f"error: interrupted by {sig}; partial output was removed" in res.stderr
    assert tree_state(store) == before  # no .airgap-staging-* left, nothing installed
