"""SIGTERM / SIGHUP / Ctrl-C in the middle of pack or unpack leaves nothing half-written.

The CLI runs in a child process with default signal dispositions set by the test (so these
pass under ``nohup`` or from a background job, whose children inherit SIGINT ignored); a real
signal is sent to it by the process itself at a known point (after the second part file, or
after the second staged blob; sent to the main thread, as a terminal's Ctrl-C or ``kill``
reaches a single-threaded tool), so the test is deterministic without timing.
The destination must then be exactly as before.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from airgap_helpers import KeyPair, tree_state

from tests.weights.cli_util import run_interrupted
from weights import Lockfile


def _run_interrupted(
    module: str, owner: tuple[str, ...], attr: str, sig: str, args: list[str]
) -> subprocess.CompletedProcess[str]:
    # The child gets default signal dispositions from the test (passes under nohup / `&`).
    return run_interrupted(module, owner, attr, sig, args, cli="airgap.cli")


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
    assert res.returncode == 128 + getattr(signal, sig), res.stderr
    assert (f"airgap: error [interrupted]: interrupted by {sig}; nothing half-written was left"
            in res.stderr)
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
    res = _run_interrupted("airgap.install", ("StagedFile",), "close", sig, [
        "unpack", str(pristine_bundle), "--public-key", str(keys.public_path), "--into",
        str(store), "--workers", workers, "--quiet"])
    # Ended by the same signal (as seen by a shell: 128 + N), after cleaning up.
    assert res.returncode == 128 + getattr(signal, sig), res.stderr
    assert (f"airgap: error [interrupted]: interrupted by {sig}; nothing half-written was left"
            in res.stderr)
    assert tree_state(store) == before  # no .airgap-staging-* left, nothing installed


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_interrupted_verify_json_says_so(
    pristine_bundle: Path, keys: KeyPair, sig: str, status: int
) -> None:
    res = run_interrupted("airgap.verify", (), "check_index", sig, [
        "verify", str(pristine_bundle), "--public-key", str(keys.public_path), "--json"],
        cli="airgap.cli", after=1, shell_status=True)
    *doc, last = res.stdout.splitlines()
    assert last == f"status={status}", res.stdout + res.stderr
    got = json.loads("\n".join(doc))
    assert got["ok"] is False and got["interrupted"] is True and got["signal"] == sig
    assert f"airgap: error [interrupted]: interrupted by {sig}" in res.stderr


class _SignalRaised(BaseException):
    """What a signal handler raises (as clishell's Interrupted): not an Exception."""


class _SecondSignal(BaseException):
    """What the handler of a second signal raises during the cleanup wait."""


@pytest.mark.parametrize("second_signal", [False, True], ids=["one-signal", "second-signal"])
def test_a_signal_while_the_hash_workers_start_waits_for_the_started_ones(
    pristine_bundle: Path, monkeypatch: pytest.MonkeyPatch, second_signal: bool,
) -> None:
    """``airgap unpack --workers 2`` interrupted while its second worker was starting left a
    ``.airgap-staging-*`` directory (1 run in 10 under load): the exception came out of
    ``Thread.start`` before the wait that stops the workers, the caller removed the staging
    directory while the first worker still wrote into it. Here the first worker is held inside
    its first range and the signal handler raises in the second ``start()``; a second signal
    during the wait for it (its handler raises too) must not cut that wait short."""
    import os
    import threading
    import time

    from airgap.bundle import INDEX_NAME
    from airgap.media import check_parts
    from airgap.stream import hash_ranges
    from airgap.validate import parse_index
    from airgap.verify import blob_ranges

    index = parse_index((pristine_bundle / INDEX_NAME).read_bytes())
    _, readable = check_parts(pristine_bundle, index)
    ranges = blob_ranges(index, index.blobs)
    assert len(ranges) >= 2
    in_range = threading.Event()
    busy: list[str] = []  # workers inside a range now

    class HeldSink:
        def __init__(self) -> None:
            busy.append(threading.current_thread().name)
            in_range.set()
            time.sleep(0.5)  # still writing when the signal comes

        def write(self, data: memoryview) -> None:
            pass

        def close(self) -> None:
            busy.remove(threading.current_thread().name)

    start = threading.Thread.start

    def interrupted_start(self: threading.Thread) -> None:
        start(self)
        if self.name == "airgap-hash-0":
            assert in_range.wait(10)
            raise _SignalRaised  # as a handler raising in start()'s wait for the next worker

    def second(signum: int, frame: object) -> None:
        raise _SecondSignal

    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    if second_signal:
        previous = signal.signal(signal.SIGUSR1, second)
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
    try:
        with pytest.raises(_SignalRaised):
            hash_ranges(pristine_bundle, index, ranges, readable=readable, workers=2,
                        sink=lambda rng: HeldSink())
    finally:
        if second_signal:
            timer.join(10)
            signal.signal(signal.SIGUSR1, previous)
    assert busy == []  # the started worker stopped before the caller went on
    monkeypatch.undo()
    assert [t.name for t in threading.enumerate() if t.name.startswith("airgap-hash")] == []
