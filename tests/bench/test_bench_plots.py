"""``make bench-plots``: the relay benchmark's own JSON, drawn by bench/plots.py.

A small real run of ``bench/relay.py --only stalls --json`` (the gateway and the backend direct,
on loopback) is drawn; the SVG names every target, the PNG is a PNG, and drawing the same JSON
again gives the same bytes (no timestamps or random ids). JSON without the paced phase's
figures is refused with exit 2 and a line saying what to run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.bench.scripts import BENCH
from tests.conftest import default_signals

PLOTS = BENCH / "plots.py"


def _plots(relay: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PLOTS), "--relay", str(relay), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)


def test_plots_of_a_real_relay_run(tmp_path: Path) -> None:
    relay = tmp_path / "relay.json"
    argv = [sys.executable, str(BENCH / "relay.py"), "--only", "stalls", "--skip", "burst",
            "--stall-streams", "16", "--paced-tokens", "20", "--rounds", "1", "--nginx", "off",
            "--json", str(relay)]
    run = subprocess.run(default_signals(argv), capture_output=True, text=True, timeout=240,
                         cwd=BENCH, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    targets = json.loads(relay.read_text())["targets"]
    assert {"direct", "gateway"} <= set(targets)
    first = _plots(relay, tmp_path / "a")
    assert first.returncode == 0, first.stderr
    svg = (tmp_path / "a" / "relay-stalls.svg").read_text()
    assert svg.startswith("<?xml") and "<svg" in svg
    for text in ("direct", "gateway", "stall-free streams (%)", "relay CPU per event"):
        assert text in svg, text
    assert (tmp_path / "a" / "relay-stalls.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _plots(relay, tmp_path / "b").returncode == 0
    for name in ("relay-stalls.svg", "relay-stalls.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_json_without_the_paced_phase_is_refused(tmp_path: Path) -> None:
    relay = tmp_path / "relay.json"
    relay.write_text(json.dumps({"targets": {"gateway": {"ttft_p50_ms": 1.0}}}))
    run = _plots(relay, tmp_path / "out")
    assert run.returncode == 2
    assert "run bench/relay.py --only stalls --json" in run.stderr
    assert not (tmp_path / "out").exists()
