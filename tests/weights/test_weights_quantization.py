"""Sizing reads ``quantization_config`` (every scheme vLLM loads) and counts MLA with its real
shapes: DeepSeek-V3's own config.json is 671.03 B parameters stored in FP8, about 673 GB, one
node of 8 x H200, not 1,342 GB on two; ``weights size`` and ``weights plan`` agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.weights.cli_util import run_cli
from weights.errors import SizingError
from weights.memory import size_model
from weights.quantization import read_quantization
from weights.sizing import estimate_params

CONFIGS = Path(__file__).parent / "configs"
#: The quantization_config of deepseek-ai/DeepSeek-V3's config.json on the Hub.
DEEPSEEK_FP8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                "weight_block_size": [128, 128]}
H200 = 141 * 10**9


def _deepseek(tmp_path: Path | None = None) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads((CONFIGS / "deepseek-v3.json").read_text())
    cfg["quantization_config"] = DEEPSEEK_FP8
    return cfg


def test_mla_is_counted_with_its_real_projection_shapes() -> None:
    # 671,026,404,352: embeddings 2 x 129,280 x 7,168, 61 MLA blocks (q_a 7,168 x 1,536,
    # q_b 1,536 x 128 x 192, kv_a 7,168 x 576, kv_b 512 x 128 x 256, o 16,384 x 7,168 and
    # two norms), 3 dense and 58 MoE MLPs (257 experts x 3 x 7,168 x 2,048 + router).
    est = estimate_params(_deepseek())
    assert est.value == 671_026_404_352
    assert "q_lora_rank" in est.source and " head_dim" not in est.source


def test_deepseek_v3_fp8_is_sized_as_fp8_and_fits_one_h200_node() -> None:
    r = size_model(_deepseek(), gpu_mem_bytes=H200, gpus=8)
    weights = r.figure("weights")
    assert 670e9 < weights.value < 675e9  # was 1,342 GB (sized as bfloat16)
    assert "quantization_config.quant_method=fp8" in weights.source
    assert "weight_block_size=[128, 128]" in weights.source
    assert r.weights_dtype is not None and r.weights_dtype.name.startswith("fp8")
    assert r.fits is True and r.min_gpus == 8
    bf16 = json.loads((CONFIGS / "deepseek-v3.json").read_text())
    assert size_model(bf16).figure("weights").value > 1.3e12  # no quantization_config: bf16


@pytest.mark.parametrize(("q", "bits"), [
    (DEEPSEEK_FP8, 8 + 32 / 16384),
    ({"quant_method": "fbgemm_fp8"}, 8),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {
        "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
                                                       "strategy": "group",
                                                       "group_size": 128}}}}, 4 + 16 / 128),
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}, 8),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, 4 + 20 / 128),
    ({"quant_method": "gptq", "bits": 8, "group_size": -1}, 8),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True,
      "bnb_4bit_quant_type": "nf4"}, 4.5),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 8),
    ({"quant_method": "mxfp4"}, 4.25),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, 4.5),
], ids=["fp8-block", "fbgemm", "ct-w4a16", "ct-fp8", "awq", "gptq8", "bnb4", "bnb8", "mxfp4",
        "nvfp4"])
def test_every_scheme_gives_its_width_and_cites_it(q: dict[str, Any], bits: float) -> None:
    got = read_quantization({"quantization_config": q})
    assert got is not None and got.bits == pytest.approx(bits)
    assert got.source.startswith("config.json:quantization_config.quant_method=")


def test_an_unknown_scheme_is_an_error_not_a_bf16_guess() -> None:
    with pytest.raises(SizingError, match="'aqlm' is not a scheme"):
        read_quantization({"quantization_config": {"quant_method": "aqlm"}})


def test_size_and_plan_agree_on_the_weights(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(_deepseek()))
    r = run_cli(["size", str(cfg), "--gpu-mem", "141GB", "--gpus", "8", "--json"])
    assert r.returncode == 0, r.stderr
    size_doc = json.loads(r.stdout)
    size_w = next(f for f in size_doc["figures"] if f["name"] == "weights")
    r = run_cli(["plan", str(cfg), "--gpu", "h200", "--json"])
    plan_doc = json.loads(r.stdout)
    plan_w = next(f for f in plan_doc["memory"] if f["name"] == "weights")
    assert size_w["value"] == plan_w["value"] and size_w["source"] == plan_w["source"]
    assert r.returncode == 0 and plan_doc["fits"] is True, r.stderr


# -- the plan chooses by the operator's goal and says why --------------------------------------

def _llama_plan(goal: str) -> Any:
    from weights.gpus import gpu_spec
    from weights.plan import make_plan
    from weights.plan_types import Cluster, Workload

    cfg = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    return make_plan(cfg, None, Cluster(gpu_spec("h200"), 8, 1),
                     Workload(concurrency=16, goal=goal))


def test_throughput_goal_picks_the_highest_estimate_and_says_why() -> None:
    from weights.plan_speed import aggregate_tokens_s

    p = _llama_plan("throughput")
    assert p.layout is not None
    best = aggregate_tokens_s(p, p.layout)
    assert all(aggregate_tokens_s(p, a) <= best for a in p.alternatives)
    assert p.why.startswith("goal throughput") and f"{best:,.0f} tok/s all replicas" in p.why
    assert "; next TP" in p.why


def test_latency_and_cost_goals_choose_by_their_own_figure() -> None:
    from weights.plan_speed import speed

    def per_seq(p: Any, lay: Any) -> float:
        return next(f.value for f in speed(p, lay) if f.name == "decode tokens/s per sequence")

    lat = _llama_plan("latency")
    assert lat.layout is not None
    assert all(per_seq(lat, a) <= per_seq(lat, lat.layout) for a in lat.alternatives)
    cost = _llama_plan("cost")
    assert cost.layout is not None and cost.layout.gpus_per_replica == 1
    assert cost.why.startswith("goal cost")
    with pytest.raises(SizingError, match="goal 'speed'"):
        _llama_plan("speed")


def test_plan_cli_prints_why() -> None:
    r = run_cli(["plan", str(CONFIGS / "llama-3.1-8b.json"), "--gpu", "h200",
                 "--concurrency", "16", "--json"])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["why"].startswith("goal throughput")


def test_a_declared_fp8_kv_cache_is_cited() -> None:
    cfg = json.loads((CONFIGS / "llama-3.1-8b.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float",
                                            "strategy": "channel"}}},
        "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor"}}
    r = size_model(cfg)
    assert r.kv_dtype is not None
    assert "fp8 (config.json:quantization_config.kv_cache_scheme)" in r.kv_dtype.source
    fp8 = size_model(cfg, kv_dtype="fp8")
    assert fp8.figure("kv cache per token").value * 2 == r.figure("kv cache per token").value


def test_header_counts_are_checked_against_the_config_estimate(tmp_path: Path) -> None:
    from tests.hub_emulator.safetensors_gen import make_safetensors
    from weights.sizing import count_params, read_header_file

    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 128,
           "intermediate_size": 128, "tie_word_embeddings": True}
    f = tmp_path / "model.safetensors"
    f.write_bytes(make_safetensors({"embed": ("BF16", [128, 64])}))  # only the embedding
    r = size_model(cfg, count_params([(f.name, read_header_file(f))]))
    check = r.figure("parameters (config estimate)")
    assert check.value == estimate_params(cfg).value
    # 49,344 by the architecture (embedding 8,192 + attention 16,384 + MLP 24,576 + norms)
    assert check.value == 49_344
    assert "safetensors headers count -83.4 % against it" in check.source
