"""``make bench-plots``: the benchmarks' own JSON, drawn by bench/plots.py.

Small real runs are drawn: ``bench/relay.py --only stalls --json`` (the gateway and the backend
direct, on loopback), ``bench/routing.py --json`` (two strategies through one gateway pod and
through two) and ``bench/flow_grid.py --json`` (one grid point). Each SVG names what it draws,
and drawing the same JSON again gives the same bytes (no timestamps or random ids). JSON
without the figures a plot needs is refused with exit 2 and a line saying what to run.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.scripts import BENCH
from tests.conftest import default_signals

PLOTS = BENCH / "plots.py"


def _plots(relay: Path, out: Path, flag: str = "--relay") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PLOTS), flag, str(relay), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)


def _bench(script: str, *args: str) -> None:
    argv = [sys.executable, str(BENCH / script), *args]
    run = subprocess.run(default_signals(argv), capture_output=True, text=True, timeout=840,
                         cwd=BENCH, check=False)
    assert run.returncode == 0, run.stderr[-2000:]


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


@pytest.mark.slow
@pytest.mark.timeout(900)  # five servers start one after the other: slow on two busy cores
def test_plots_of_a_real_routing_run_with_two_pods(tmp_path: Path) -> None:
    routing = tmp_path / "routing.json"
    _bench("routing.py", "--workload", "shared-prefix", "--replicas", "2", "--profile",
           "llama-3.1-8b-h100", "--rate", "6", "--groups", "2", "--prompts-per-group", "3",
           "--system-tokens", "120", "--question-tokens", "10", "--output-tokens", "4",
           "--strategy", "least_outstanding", "--strategy", "prefix_affinity",
           "--gateways", "1", "--gateways", "2", "--json", str(routing))
    results = json.loads(routing.read_text())["workloads"]["shared-prefix"]["results"]
    assert set(results) == {"least_outstanding", "prefix_affinity", "least_outstanding@2pods",
                            "prefix_affinity@2pods"}
    first = _plots(routing, tmp_path / "a", "--routing")
    assert first.returncode == 0, first.stderr
    assert first.stdout.split() == [str(tmp_path / "a" / "routing-ttft.svg"),
                                    str(tmp_path / "a" / "routing-pods.svg")]
    ttft = (tmp_path / "a" / "routing-ttft.svg").read_text()
    assert ttft.startswith("<?xml") and "<svg" in ttft
    for text in ("least_outstanding", "prefix_affinity", "TTFT (s)", "shared-prefix"):
        assert text in ttft, text
    assert "@2pods" not in ttft  # the pods are the other figure's
    pods = (tmp_path / "a" / "routing-pods.svg").read_text()
    for text in ("1 pod", "2 pods", "prefix-cache hit ratio", "prefix_affinity"):
        assert text in pods, text
    # The bar labels are the run's own figures.
    p50 = results["prefix_affinity@2pods"]["ttft_p50_s"]
    assert f"{p50:.3f}" in pods
    assert _plots(routing, tmp_path / "b", "--routing").returncode == 0
    for name in ("routing-ttft.svg", "routing-pods.svg"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_plots_of_a_real_flow_grid_run(tmp_path: Path) -> None:
    grid = tmp_path / "grid.json"
    _bench("flow_grid.py", "--prompts", "64", "--outputs", "16", "--rates", "4", "--middle",
           "none", "--window", "4", "--warmup", "1", "--unloaded-window", "2",
           "--min-samples", "4", "--time-scale", "1", "--json", str(grid))
    doc = json.loads(grid.read_text())
    [point] = doc["points"]
    assert (point["batch_prompt"], point["batch_output"], point["interactive_rps"]) == (64, 16, 4)
    assert point["fc"]["batch_tok_s"] > 0 and point["no-fc"]["batch_tok_s"] > 0
    run = _plots(grid, tmp_path / "a", "--grid")
    assert run.returncode == 0, run.stderr
    svg = (tmp_path / "a" / "flow-grid.svg").read_text()
    verdict = f"{int(point['pass'])} of 1 points pass"
    for text in ("64/16", "4 req/s", "target 1.5x", "configured share 0.50", verdict,
                 f"{point['ttft_ratio']:.2f}", f"{point['batch_ratio']:.2f}"):
        assert text in svg, text
    assert _plots(grid, tmp_path / "b", "--grid").returncode == 0
    assert (tmp_path / "a" / "flow-grid.svg").read_bytes() == (
        tmp_path / "b" / "flow-grid.svg").read_bytes()


@pytest.mark.parametrize(("flag", "doc", "hint"), [
    ("--routing", {"workloads": {"random": {"params": {}, "results": {}}}},
     "run bench/routing.py --json"),
    ("--grid", {"unloaded": {}, "points": []}, "run bench/flow_grid.py --json"),
])
def test_json_without_figures_is_refused(tmp_path: Path, flag: str, doc: object,
                                         hint: str) -> None:
    path = tmp_path / "in.json"
    path.write_text(json.dumps(doc))
    run = _plots(path, tmp_path / "out", flag)
    assert run.returncode == 2
    assert re.search(re.escape(hint), run.stderr)
    assert not (tmp_path / "out").exists()


def _routing_doc(kv_events: bool, prompt_format: str, p50: float, hit: float) -> dict[str, object]:
    """A ``bench/routing.py --json`` document of one workload through one pod and through 3."""
    row = {"ttft_p50_s": p50, "ttft_p90_s": 2 * p50, "ttft_p99_s": 3 * p50, "hit_ratio": hit}
    pods = {**row, "ttft_p50_s": p50 + 0.0005, "hit_ratio": hit - 0.01}
    return {"args": {"kv_events": kv_events, "prompt_format": prompt_format},
            "workloads": {"multi-turn": {"params": {"replicas": 4}, "results": {
                "prefix_affinity": row, "prefix_affinity@3pods": pods}}}}


def test_routing_plots_label_the_cache_state_of_each_run(tmp_path: Path) -> None:
    estimate = tmp_path / "estimate.json"
    exact = tmp_path / "exact.json"
    chat_events = tmp_path / "chat-events.json"
    estimate.write_text(json.dumps(_routing_doc(False, "chat", 0.1234, 0.611)))
    exact.write_text(json.dumps(_routing_doc(True, "tokens", 0.0567, 0.789)))
    # KV events with chat prompts: the gateways have no token ids, so they score the estimate.
    chat_events.write_text(json.dumps(_routing_doc(True, "chat", 0.2, 0.5)))
    argv = [sys.executable, str(PLOTS), "--routing", str(estimate), "--routing", str(exact),
            "--out", str(tmp_path / "a")]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    pods = (tmp_path / "a" / "routing-pods.svg").read_text()
    for text in ("1 pod, estimate", "3 pods, estimate", "1 pod, exact (KV events)",
                 "3 pods, exact (KV events)", "0.123", "0.124", "0.057", "0.61", "0.79", "0.78"):
        assert text in pods, text
    ttft = (tmp_path / "a" / "routing-ttft.svg").read_text()
    for text in ("gateway cache state: estimate", "gateway cache state: exact (KV events)"):
        assert text in ttft, text
    # Two runs of one cache state cannot be told apart in the figure: refused.
    argv = [sys.executable, str(PLOTS), "--routing", str(estimate), "--routing",
            str(chat_events), "--out", str(tmp_path / "b")]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2
    assert "two --routing runs of the same cache state" in run.stderr
    assert not (tmp_path / "b").exists()


def _grid_invocation(prompt: int, rps: float, replicas: int, ttft: float) -> dict[str, object]:
    """A ``bench/flow_grid.py --json`` document of one point measured with the busy reserve
    arm only (``--phases fc-reserve-busy``), as run 15 of docs/flow-control.md was."""
    return {
        "params": {"replicas": replicas, "profile": "p", "time_scale": 10.0, "max_num_seqs": 8,
                   "batch_in_flight": 4, "strategy": "least_outstanding",
                   "long_prefill_token_threshold": 64, "scheduling_policy": "priority",
                   "reserve": 5, "reserve_lower": 2, "reserve_busy_s": 5.0, "target": 1.5,
                   "min_samples": 60 if rps == 1 else 100,
                   "started": f"2026-12-05 18:{10 + prompt // 1000:02d} UTC",
                   "ended": f"2026-12-05 18:{20 + prompt // 1000:02d} UTC"},
        "points": [{"batch_prompt": prompt, "batch_output": 16, "interactive_rps": rps,
                    "share": 0.5, "ttft_ratio_no_fc": 30.0, "ttft_ratio_busy": ttft,
                    "batch_ratio_busy": 0.55, "pass_busy": ttft <= 1.5}],
    }


def test_grid_run_of_several_invocations_is_drawn_as_one(tmp_path: Path) -> None:
    paths = []
    for n, doc in enumerate([_grid_invocation(64, 4, 11, 1.01),
                             _grid_invocation(4096, 1, 11, 1.93)]):
        paths += ["--grid", str(tmp_path / f"g{n}.json")]
        (tmp_path / f"g{n}.json").write_text(json.dumps(doc))
    run = subprocess.run([sys.executable, str(PLOTS), *paths, "--out", str(tmp_path / "o"),
                          "--grid-svg", "run.svg"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    svg = (tmp_path / "o" / "run.svg").read_text()
    for text in ("1 of 2 points pass with the reserve", "run of 2026-12-05 18:10 UTC", "64/16",
                 "4096/16", "1.01", "1.93", "lower_busy_s 5.0", "min_samples=60"):
        assert text in svg, text


def test_grid_invocations_of_different_fleets_are_refused(tmp_path: Path) -> None:
    paths = []
    for n, doc in enumerate([_grid_invocation(64, 4, 11, 1.0), _grid_invocation(64, 1, 4, 1.0)]):
        paths += ["--grid", str(tmp_path / f"g{n}.json")]
        (tmp_path / f"g{n}.json").write_text(json.dumps(doc))
    run = subprocess.run([sys.executable, str(PLOTS), *paths, "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2
    assert "--grid #2: replicas is 4, the first run's is 11" in run.stderr
    assert not (tmp_path / "o").exists()
