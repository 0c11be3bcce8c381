"""A hostile index costs little: refused before any part is read, with bounded output.

Measured in a child process (``resource.getrusage`` of that process: peak RSS, and wall time
around ``airgap verify`` only, after a warm-up call has done typer's lazy imports), on a shared
2-core machine; the bounds are generous so that a loaded machine does not make them flake, and
the measured figures are printed (``pytest -s``) and recorded in docs/airgap.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from airgap_helpers import KeyPair, load_index, resign

ROOT = Path(__file__).resolve().parents[2]
HOSTILE_PARTS = 300_000
MAX_PARTS = 10_000  # airgap.bundle.MAX_PARTS, what pack writes at most

# The last argument must be the public key path (used by the warm-up call).
_MEASURE = """
import json, resource, sys, time, io, contextlib
from airgap.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    main(["verify", "/nonexistent", "--public-key", sys.argv[-1]])  # typer's lazy imports
started, cpu_started = time.perf_counter(), time.process_time()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    rc = main(sys.argv[1:])
seconds = time.perf_counter() - started
cpu_seconds = time.process_time() - cpu_started
rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
print(json.dumps({"rc": rc, "seconds": seconds, "cpu_seconds": cpu_seconds,
                  "rss_mib": rss_mib, "stdout": out.getvalue(), "stderr": err.getvalue()}))
"""


# Linux keeps a process's peak RSS across execve and a vfork()ed child runs in its parent's
# memory until then, so a child of this (large) pytest process would report pytest's peak.
# A small launcher process in between gives the measured process a clean figure.
_LAUNCH = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"


def _measure(args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    res = subprocess.run([sys.executable, "-c", _LAUNCH, sys.executable, "-c", _MEASURE, *args],
                         capture_output=True, text=True, env=env, timeout=300, check=True)
    got: dict[str, Any] = json.loads(res.stdout)
    return got


def _hostile_parts(doc: dict[str, Any]) -> None:
    width = len(str(HOSTILE_PARTS))
    doc["parts"] = [{"name": f"payload.{i:0{width}d}-of-{HOSTILE_PARTS}", "offset": i,
                     "size": 1, "sha256": "0" * 64} for i in range(HOSTILE_PARTS)]
    doc["payload_size"] = HOSTILE_PARTS


def test_unsigned_300k_part_index_is_refused_fast_and_small(bundle: Path,
                                                           keys: KeyPair) -> None:
    doc = load_index(bundle)
    _hostile_parts(doc)
    (bundle / "index.json").write_text(json.dumps(doc))  # index.sig no longer matches
    assert (bundle / "index.json").stat().st_size > 30 * 1024**2
    got = _measure(["verify", str(bundle), "--json", "--public-key", str(keys.public_path)])
    print(f"\nunsigned {HOSTILE_PARTS}-part index: refused in {got['seconds']:.3f} s "
          f"({got['cpu_seconds']:.3f} CPU-s), peak RSS {got['rss_mib']:.0f} MiB")
    assert got["rc"] == 1
    report = json.loads(got["stdout"])
    assert [p["code"] for p in report["problems"]] == ["signature_invalid"]
    assert report["parts"] is None and report["bytes_hashed"] == 0
    # The target is 1 s; CPU time is what a loaded shared machine cannot inflate, wall time
    # gets a generous bound.
    assert got["cpu_seconds"] < 1.0
    assert got["seconds"] < 5.0
    assert got["rss_mib"] < 100


def test_signed_index_with_too_many_parts_is_refused_by_the_validator(
    bundle: Path, keys: KeyPair
) -> None:
    doc = load_index(bundle)
    _hostile_parts(doc)
    resign(bundle, doc, keys.private)  # a trusted but compromised or buggy packer
    got = _measure(["verify", str(bundle), "--json", "--public-key", str(keys.public_path)])
    print(f"\nsigned {HOSTILE_PARTS}-part index: refused in {got['seconds']:.3f} s "
          f"({got['cpu_seconds']:.3f} CPU-s), peak RSS {got['rss_mib']:.0f} MiB")
    assert got["rc"] == 1
    [problem] = json.loads(got["stdout"])["problems"]
    assert problem["code"] == "index_invalid"
    assert f"lists {HOSTILE_PARTS} parts, at most {MAX_PARTS}" in problem["message"]
    assert got["seconds"] < 60.0  # parsed in full: it is signed by a trusted key


@pytest.mark.parametrize("as_json", [False, True])
def test_problem_output_is_bounded(bundle: Path, keys: KeyPair, as_json: bool) -> None:
    doc = load_index(bundle)
    parts = len(doc["parts"])
    for p in doc["parts"]:
        (bundle / p["name"]).unlink()  # every part missing: one problem each
    # ... and many extra payload files lying beside them
    for i in range(60):
        (bundle / f"payload.stray-{i:03d}").write_bytes(b"x")
    args = ["verify", str(bundle), "--public-key", str(keys.public_path)]
    if as_json:
        args.insert(2, "--json")
    got = _measure(args)
    assert got["rc"] == 1
    if as_json:
        report = json.loads(got["stdout"])
        assert len(report["problems"]) == 20
        total = report["problems_total"]
        assert total >= parts + 60 and report["problems_omitted"] == total - 20
    else:
        lines = got["stderr"].splitlines()
        assert len(lines) == 21
        more = re.fullmatch(r"FAIL \.\.\. and (\d+) more problem\(s\) \((\d+) in all; fix "
                            r"these first\)", lines[-1])
        assert more is not None, lines[-1]
        assert int(more[1]) + 20 == int(more[2]) >= 60
