"""``weights size`` and ``weights plan`` answer the same memory question the same way.

Before, the two commands asked the same question under different flags and defaults
(``size``: ``--context 0 --concurrency 1``, no engine overhead, ``--gpus``, ``--utilization``;
``plan``: ``--context 8192 --concurrency 16``, 2 GiB overhead, ``--gpus-per-node``,
``--gpu-memory-utilization``), and ``size`` ignored sliding-window layers: the same model gave
different KV and per-GPU figures. Now both take the workload flags of ``weights/cli_workload.py``
with the defaults of ``weights.plan.Workload``, and every figure they both report is equal,
value and source, when the plan's layout is the one replica ``size`` describes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.weights.cli_util import run_cli

CONFIGS = Path(__file__).parent / "configs"


def _json(args: list[str]) -> dict[str, Any]:
    run = run_cli([*args, "--json"])
    assert run.returncode in (0, 1), run.stderr
    doc: dict[str, Any] = json.loads(run.stdout)
    return doc


def _by_name(figures: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in figures}


# (config, flags both commands get). Each plan chooses one replica of TP = --gpus-per-node
# (asserted below), the layout `size` reports.
CASES = [
    ("llama-3.1-8b.json", ["--gpus-per-node", "1"]),  # the defaults: 8192 x 16, 2 GiB, 0.9
    ("llama-3.1-405b.json", ["--dtype", "fp8", "--gpus-per-node", "8", "--context", "4096",
                             "--concurrency", "8"]),
    ("gemma-2-9b.json", ["--gpus-per-node", "1", "--context", "16384", "--concurrency", "2",
                         "--gpu-memory-utilization", "0.85", "--overhead", "3GiB"]),
    ("mistral-7b-v0.1.json", ["--gpus-per-node", "1", "--gpu", "l40s", "--kv-dtype", "fp8"]),
]


@pytest.mark.parametrize(("config", "flags"), CASES, ids=[c for c, _ in CASES])
def test_same_flags_give_the_same_figures(config: str, flags: list[str]) -> None:
    target = str(CONFIGS / config)
    gpu = [] if "--gpu" in flags else ["--gpu", "h100-sxm"]
    size = _json(["size", target, "--estimate", *gpu, *flags])
    plan = _json(["plan", target, "--estimate", *gpu, *flags])
    tp = int(flags[flags.index("--gpus-per-node") + 1])
    layout = plan["layout"]
    assert layout is not None and (layout["tensor_parallel"], layout["pipeline_parallel"],
                                   layout["replicas"]) == (tp, 1, 1), layout
    sized, planned = _by_name(size["figures"]), _by_name(plan["memory"])
    shared = sorted(set(sized) & set(planned))
    for name in ("weights", "kv cache per sequence", "kv cache for context x concurrency",
                 "weights per gpu", "kv cache per gpu", "engine overhead per gpu",
                 "usable per gpu", "left per gpu", "gpu memory total"):
        assert name in shared, name
    for name in shared:
        assert (sized[name]["value"], sized[name]["source"]) == (
            planned[name]["value"], planned[name]["source"]), name
    assert size["fits"] is plan["fits"] is True


def test_both_default_to_the_same_workload() -> None:
    """No workload flag at all: the same context, concurrency, overhead and utilization."""
    target = str(CONFIGS / "llama-3.1-8b.json")
    size = _by_name(_json(["size", target, "--estimate", "--gpu", "h100-sxm",
                           "--gpus-per-node", "1"])["figures"])
    plan = _by_name(_json(["plan", target, "--estimate", "--gpus-per-node", "1"])["memory"])
    for name in ("kv cache for context x concurrency", "engine overhead per gpu",
                 "usable per gpu"):
        assert size[name] == plan[name], name
    assert "8192 (--context)" in size["kv cache per sequence"]["source"]
    assert "x 16 (--concurrency)" in size["kv cache for context x concurrency"]["source"]


def test_the_old_flag_names_still_work_hidden() -> None:
    target = str(CONFIGS / "llama-3.1-8b.json")
    new = _json(["size", target, "--estimate", "--gpu-mem", "80GB", "--gpus-per-node", "2",
                 "--gpu-memory-utilization", "0.8"])
    old = _json(["size", target, "--estimate", "--gpu-mem", "80GB", "--gpus", "2",
                 "--utilization", "0.8"])
    assert new == old
    plan_old = _json(["plan", target, "--estimate", "--utilization", "0.8"])
    plan_new = _json(["plan", target, "--estimate", "--gpu-memory-utilization", "0.8"])
    assert plan_old == plan_new
    for command in ("size", "plan"):
        help_text = run_cli([command, "--help"], extra_env={"COLUMNS": "200"}).stdout
        assert "--gpu-memory-utilization" in help_text and "--utilization" not in help_text
        assert "--gpus-per-node" in help_text and "--gpus " not in help_text


@pytest.mark.parametrize(("command", "old", "new"), [
    ("size", ["--utilization", "0.8"], ["--gpu-memory-utilization", "0.9"]),
    ("size", ["--gpus", "2"], ["--gpus-per-node", "8"]),
    ("size", ["--gpus", "8"], ["--gpus-per-node", "8"]),  # equal values: still both given
    ("plan", ["--utilization", "0.8"], ["--gpu-memory-utilization", "0.9"]),
])
def test_an_old_flag_and_its_new_name_together_are_a_usage_error(
        command: str, old: list[str], new: list[str]) -> None:
    # Before, the old one won silently (--gpu-memory-utilization 0.9 was ignored for 0.8).
    target = str(CONFIGS / "llama-3.1-8b.json")
    for order in ([*old, *new], [*new, *old]):
        run = run_cli([command, target, "--estimate", "--gpu-mem", "80GB", *order, "--json"])
        assert run.returncode == 2, (order, run.stdout, run.stderr)
        assert run.stderr.count("\n") == 1 and "usage_error" in run.stderr, run.stderr
        assert old[0] in run.stderr and new[0] in run.stderr, run.stderr
        assert json.loads(run.stdout)["error"]["code"] == "usage_error"
