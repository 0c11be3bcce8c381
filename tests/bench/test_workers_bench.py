"""``bench/workers.py`` end to end, small: a few paced streams through ``gateway serve
--workers 1`` and ``--workers 2`` with each harness; nothing is timed, the rows are checked."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.bench.scripts import BENCH
from tests.conftest import default_signals


@pytest.mark.parametrize("harness", ["python", "c"])
def test_the_streams_go_through_one_and_two_workers(harness: str) -> None:
    if harness == "c":
        from tests.bench.scripts import bench_module

        why = bench_module("relay_harness").build_c_tools()
        if why is not None:
            pytest.skip(f"C harness not built: {why.splitlines()[0]}")
    argv = [sys.executable, str(BENCH / "workers.py"), "--streams", "8", "--tokens", "3",
            "--itl-ms", "5", "--workers", "1,2", "--harness", harness]
    done = subprocess.run(default_signals(argv), capture_output=True, text=True, timeout=240,
                          cwd=BENCH, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"# harness {harness}" in done.stderr
    rows = {line[:22].strip(): line for line in done.stdout.splitlines()
            if line.startswith(("direct", "gateway"))}
    assert set(rows) == {"direct", "gateway 1 worker(s)", "gateway 2 worker(s)"}, done.stdout
    for name, line in rows.items():
        assert line[22:33].split() == ["8/8"], (name, line)  # every stream completed
    assert "gateway 2 worker(s) / 1 worker" in done.stdout
