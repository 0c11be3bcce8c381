"""``weights size --gpu`` says why a replica does not fit when the memory would.

A model with 12 attention heads (all-MiniLM-L6-v2's shape) on the default 8 GPUs per replica:
vLLM refuses tensor-parallel degree 8 (it does not divide 12 heads), so ``size`` exits 1. Before,
it printed "does NOT fit on 8 GPU(s)" next to 64.8 GiB left per GPU, with no reason, and a
"smallest tensor-parallel degree that fits: 1": a contradiction a user could not resolve.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.weights.cli_util import run_cli

# all-MiniLM-L6-v2's config.json (the fields sizing reads).
_CONFIG = {
    "architectures": ["BertModel"], "model_type": "bert", "hidden_size": 384,
    "intermediate_size": 1536, "num_attention_heads": 12, "num_hidden_layers": 6,
    "vocab_size": 30522, "max_position_embeddings": 512, "torch_dtype": "float32",
}


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_CONFIG), encoding="utf-8")
    return path


def test_refused_tensor_parallel_degree_is_named(tmp_path: Path) -> None:
    run = run_cli(["size", str(_config(tmp_path)), "--estimate", "--gpu", "h100-sxm"])
    assert run.returncode == 1, run.stderr
    last = run.stdout.strip().splitlines()[-1]
    assert "does NOT fit on 8 GPU(s)" in last
    assert "vLLM refuses tensor-parallel degree 8: it does not divide the 12 attention heads" \
        in " ".join(run.stdout.split()), run.stdout


def test_json_carries_the_reason(tmp_path: Path) -> None:
    run = run_cli(["size", str(_config(tmp_path)), "--estimate", "--gpu", "h100-sxm", "--json"])
    assert run.returncode == 1, run.stderr
    doc = json.loads(run.stdout)
    assert (doc["fits"], doc["min_gpus"]) == (False, 1)
    assert doc["why_not"].startswith("vLLM refuses tensor-parallel degree 8")


def test_a_fitting_degree_has_no_reason(tmp_path: Path) -> None:
    run = run_cli(["size", str(_config(tmp_path)), "--estimate", "--gpu", "h100-sxm",
                   "--gpus-per-node", "4", "--json"])
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert (doc["fits"], doc["why_not"]) == (True, None)


def test_memory_shortfall_is_named(tmp_path: Path) -> None:
    run = run_cli(["size", str(_config(tmp_path)), "--estimate", "--gpu", "h100-sxm",
                   "--gpu-mem", "1GiB", "--gpus-per-node", "1"])
    assert run.returncode == 1, run.stderr
    assert "weights, KV cache and engine overhead exceed the usable memory" \
        in " ".join(run.stdout.split()), run.stdout
