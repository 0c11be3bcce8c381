"""weights plan: memory, layout, speed and vLLM arguments checked against published figures."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.hub_emulator import make_safetensors
from tests.hub_fixtures import SHARDED, HubServer
from tests.weights.cli_util import run_cli
from weights.errors import SizingError
from weights.gpus import GPUS, gpu_spec
from weights.plan import make_plan
from weights.plan_deploy import chart_name, kv_cache_dtype, vllm_args
from weights.plan_model import sliding_window_layers
from weights.plan_speed import speed
from weights.plan_types import Cluster, Plan, Workload
from weights.sizing import GB, GIB

CONFIGS = Path(__file__).parent / "configs"
KIB = 1024


def _cfg(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def _plan(name: str, gpu: str = "h100-sxm", *, per_node: int = 8, nodes: int = 1,
          intra: str = "nvlink", **work: Any) -> Plan:
    return make_plan(_cfg(name), None, Cluster(gpu_spec(gpu), per_node, nodes, intra),
                     Workload(**work))


def _fig(figs: Any, name: str) -> float:
    found = [f.value for f in figs if f.name == name]
    assert len(found) == 1, name
    return float(found[0])


# -- memory, against published figures ------------------------------------------------------

def test_405b_is_about_810_gb_bf16_405_gb_fp8_and_leaves_235_gb_on_one_node() -> None:
    bf16 = _plan("llama-3.1-405b", concurrency=1)
    assert 805 * GB < _fig(bf16.memory, "weights") < 815 * GB
    fp8 = _plan("llama-3.1-405b", dtype="fp8", concurrency=1)
    assert 402 * GB < _fig(fp8.memory, "weights") < 408 * GB
    assert _fig(fp8.memory, "gpu memory total") == 8 * 80 * GB
    assert 230 * GB < _fig(fp8.memory, "left after weights") < 240 * GB
    assert fp8.layout is not None and (fp8.layout.tp, fp8.layout.pp) == (8, 1)


def test_llama3_70b_bf16_kv_cache_is_320_kib_per_token() -> None:
    p = _plan("llama-3-70b", context=8192, concurrency=4)
    assert _fig(p.memory, "kv cache per token") == 320 * KIB
    assert _fig(p.memory, "kv cache per sequence") == 320 * KIB * 8192
    assert _fig(p.memory, "kv cache for context x concurrency") == 320 * KIB * 8192 * 4


def test_training_state_is_16_bytes_per_parameter() -> None:
    p = _plan("llama-3-70b", training=True)
    params = _fig(p.memory, "parameters")
    assert _fig(p.memory, "training state (mixed-precision Adam)") == 16 * params
    assert _fig(p.memory, "training state per gpu, fully sharded") == 16 * params / 8
    assert not any("training" in f.name for f in _plan("llama-3-70b").memory)


def test_per_gpu_memory_adds_up_and_kv_heads_are_replicated_beyond_tp() -> None:
    p = _plan("llama-3-70b", context=4096, concurrency=8, overhead_bytes=3 * GIB)
    lay = p.layout
    assert lay is not None
    kv_seq = 320 * KIB * 4096
    assert lay.weights_per_gpu == pytest.approx(_fig(p.memory, "weights") / lay.tp / lay.pp)
    assert lay.kv_per_gpu == pytest.approx(kv_seq * lay.seqs_per_replica / (lay.tp * lay.pp))
    assert lay.needed_per_gpu == pytest.approx(lay.weights_per_gpu + lay.kv_per_gpu + 3 * GIB)
    assert lay.usable_per_gpu == 80 * GB * 0.9
    # MLA keeps one latent per token: every TP rank holds all of it.
    ds = _plan("deepseek-v3", "h200", dtype="fp8", concurrency=8)
    assert ds.layout is not None and ds.layout.tp == 8
    per_seq = (512 + 64) * 61 * 2 * 8192
    assert ds.layout.kv_per_gpu == pytest.approx(per_seq * 8)


def test_sliding_window_layers_hold_only_the_window() -> None:
    mistral = _plan("mistral-7b-v0.1", context=32768, concurrency=1)
    per_token = _fig(mistral.memory, "kv cache per token")
    assert per_token == 2 * 32 * 8 * 128 * 2  # 128 KiB
    assert _fig(mistral.memory, "sliding-window layers") == 32
    assert _fig(mistral.memory, "kv cache per sequence") == per_token * 4096
    gemma = _plan("gemma-2-9b", dtype="bf16", kv_dtype="bf16", context=8192, concurrency=1)
    per_layer = 2 * 8 * 256 * 2
    assert _fig(gemma.memory, "kv cache per sequence") == per_layer * (21 * 8192 + 21 * 4096)
    oss = _plan("gpt-oss-120b", context=131072, concurrency=1)
    per_layer = 2 * 8 * 64 * 2
    assert _fig(oss.memory, "kv cache per sequence") == per_layer * (18 * 131072 + 18 * 128)
    # A short context is not cut by a longer window.
    short = _plan("mistral-7b-v0.1", context=1000, concurrency=1)
    assert _fig(short.memory, "kv cache per sequence") == per_token * 1000


@pytest.mark.parametrize(("cfg", "expected"), [
    ({"num_hidden_layers": 62, "sliding_window": 1024, "sliding_window_pattern": 6}, 52),
    ({"sliding_window": 4096, "use_sliding_window": False}, 0),
    ({"sliding_window": 32768, "use_sliding_window": True, "max_window_layers": 28}, 4),
    ({"sliding_window": None}, 0),
])
def test_sliding_window_conventions(cfg: dict[str, Any], expected: int) -> None:
    assert sliding_window_layers(cfg, int(cfg.get("num_hidden_layers", 32)))[0] == expected


def test_moe_counts_total_weights_and_active_parameters() -> None:
    p = _plan("mixtral-8x7b", concurrency=4)
    assert 46.4e9 < _fig(p.memory, "parameters") < 47.0e9  # total, published 46.7 B
    # Published 12.9 B counts the input embedding; without it (a lookup) 12.75 B.
    assert 12.6e9 < _fig(p.memory, "active parameters") < 13.0e9
    assert 92 * GB < _fig(p.memory, "weights") < 95 * GB
    oss = _plan("gpt-oss-120b")
    assert 115e9 < _fig(oss.memory, "parameters") < 119e9  # published 116.8 B
    # Published 5.13 B active, counted as here: without the input embedding.
    assert 5.08e9 < _fig(oss.memory, "active parameters") < 5.18e9


# -- layout --------------------------------------------------------------------------------

def test_small_model_gets_one_gpu_replicas_and_the_concurrency_is_spread() -> None:
    p = _plan("llama-3.1-8b", context=8192, concurrency=100, goal="cost")
    lay = p.layout
    assert lay is not None
    assert (lay.tp, lay.pp, lay.replicas) == (1, 1, 8)
    assert lay.seqs_per_replica == math.ceil(100 / 8)
    assert any("DP 8" in r for r in lay.reasons)
    alt = [(a.tp, a.pp) for a in p.alternatives]
    assert (2, 1) in alt and (8, 1) in alt
    assert alt.index((2, 1)) < alt.index((8, 1))  # ranked: smaller TP first


def test_tp_stays_in_the_nvlink_domain_and_pp_crosses_nodes() -> None:
    p = _plan("llama-3.1-405b", nodes=2, concurrency=16)
    lay = p.layout
    assert lay is not None and (lay.tp, lay.pp, lay.nodes_per_replica) == (8, 2, 2)
    assert "infiniband" in lay.reasons[1] and "NVLink" in lay.reasons[0]
    assert all(a.tp <= 8 for a in p.alternatives)
    # No NVLink (L40S): tensor parallel 1, pipeline stages over PCIe inside the node.
    l40s = _plan("llama-3-70b", "l40s", per_node=4, concurrency=4, context=4096)
    assert l40s.layout is not None and (l40s.layout.tp, l40s.layout.pp) == (1, 4)
    assert "PCIe" in l40s.layout.reasons[1]
    # H100 PCIe: NVLink bridges pair two cards.
    pcie = _plan("llama-3-70b", "h100-pcie", concurrency=4, context=4096)
    assert pcie.layout is not None and pcie.layout.tp == 2
    # --intra pcie on an SXM node: no TP.
    forced = _plan("llama-3-70b", intra="pcie", concurrency=4, context=4096)
    assert forced.layout is not None and forced.layout.tp == 1


def test_expert_parallel_for_moe_when_allowed() -> None:
    p = _plan("mixtral-8x7b", concurrency=64)
    assert p.layout is not None
    moe_tp = [a for a in (p.layout, *p.alternatives) if a.tp > 1]
    assert moe_tp and all(a.ep for a in moe_tp)
    assert all(not a.ep for a in (p.layout, *p.alternatives) if a.tp == 1)
    off = _plan("mixtral-8x7b", concurrency=64, expert_parallel=False)
    assert not any(a.ep for a in (off.layout, *off.alternatives) if a is not None)
    dense = _plan("llama-3-70b")
    assert dense.layout is not None and not dense.layout.ep


def test_does_not_fit_says_by_how_much() -> None:
    p = _plan("llama-3.1-405b", concurrency=16, context=8192)
    assert p.layout is None and p.closest is not None
    weights = _fig(p.memory, "weights")
    kv = 504 * KIB * 8192 * 16
    short = weights / 8 + kv / 8 + 2 * GIB - 72 * GB
    assert p.closest.left_per_gpu == pytest.approx(-short)
    assert f"short by {short / GB:,.1f} GB per GPU" in p.shortfall()
    assert p.fits_on_nodes == 2 and "fits on 2 nodes" in p.shortfall()


# -- speed ---------------------------------------------------------------------------------

def test_h100_ridge_point_is_about_295_and_decode_is_memory_bound_into_the_hundreds() -> None:
    h100 = GPUS["h100-sxm"]
    assert h100.bf16_flops == 989e12 and h100.bandwidth_bytes_s == 3.35e12
    p = _plan("llama-3-70b", concurrency=64, context=2048)
    assert p.layout is not None
    figs = speed(p, p.layout)
    assert 294 < _fig(figs, "ridge point") < 296
    assert 100 < _fig(figs, "decode memory-bound below batch") < 1000
    assert 290 < _fig(figs, "decode memory-bound below batch") < 300
    row = next(f for f in figs if f.name == "planned batch per replica")
    assert "memory-bound" in row.source
    lay = p.layout
    embedding = 128256 * 8192  # untied input embedding: a row lookup, not read whole
    step = (_fig(p.memory, "weights") - 2 * embedding
            + lay.seqs_per_replica * 320 * KIB * 2048) / (lay.tp * 3.35e12)
    assert _fig(figs, "decode step") == pytest.approx(step)
    assert _fig(figs, "decode tokens/s per replica") == pytest.approx(lay.seqs_per_replica / step)
    active = _fig(p.memory, "parameters") - embedding
    assert _fig(p.memory, "active parameters") == active
    assert _fig(figs, "prefill per 1,000 prompt tokens") == pytest.approx(
        2 * active * 1000 / (lay.tp * 989e12))
    assert all(f.source.startswith("estimate") for f in figs[2:] if f.name != "planned "
               "batch per replica")


def test_notes_flag_inputs_the_engine_would_refuse_or_slow_down() -> None:
    assert _plan("llama-3-70b").notes == ()
    long = _plan("llama-3-70b", context=16384, concurrency=1)
    assert any("max_position_embeddings 8192" in n for n in long.notes)
    a100 = _plan("llama-3-70b", "a100-80gb", dtype="fp8")
    assert any("no FP8 tensor cores" in n for n in a100.notes)
    mi300x = _plan("llama-3-70b", "mi300x")
    assert any("amd.com/gpu" in n for n in mi300x.notes)
    int4 = _plan("llama-3-70b", dtype="int4")
    assert any("pre-quantized" in n for n in int4.notes)


def test_fp8_uses_the_fp8_peak_only_where_the_gpu_has_it() -> None:
    h100 = speed(p := _plan("llama-3-70b", dtype="fp8"), p.layout)  # type: ignore[arg-type]
    assert _fig(h100, "peak compute") == 1979e12
    a100 = speed(q := _plan("llama-3-70b", "a100-80gb", dtype="fp8"),
                 q.layout)  # type: ignore[arg-type]
    assert _fig(a100, "peak compute") == 312e12


# -- vLLM arguments ------------------------------------------------------------------------

def test_vllm_args_follow_the_layout() -> None:
    p = _plan("mixtral-8x7b", dtype="fp8", kv_dtype="fp8", concurrency=64, context=16384,
              utilization=0.92)
    lay = p.layout
    assert lay is not None
    args = vllm_args(p, lay, stored_fp8=False)
    pairs = dict(itertools.pairwise(args))
    assert pairs["--tensor-parallel-size"] == str(lay.tp)
    assert pairs["--pipeline-parallel-size"] == str(lay.pp)
    assert pairs["--max-model-len"] == "16384"
    assert pairs["--max-num-seqs"] == str(lay.seqs_per_replica)
    assert pairs["--gpu-memory-utilization"] == "0.92"
    assert pairs["--kv-cache-dtype"] == "fp8"
    assert pairs["--quantization"] == "fp8"
    assert ("--enable-expert-parallel" in args) == lay.ep
    assert "--quantization" not in vllm_args(p, lay, stored_fp8=True)
    assert kv_cache_dtype(None) == "auto" and kv_cache_dtype("bf16") == "auto"
    with pytest.raises(SizingError, match="kv-cache-dtype"):
        kv_cache_dtype("int8")
    assert chart_name("meta-llama/Llama-3.1-8B-Instruct") == "llama-3-1-8b-instruct"
    assert chart_name("org/8b") == "m-8b"


# -- CLI -----------------------------------------------------------------------------------

def test_cli_json_fits_exit_0_and_does_not_fit_exit_1_with_shortfall() -> None:
    cfg = CONFIGS / "llama-3.1-405b.json"
    r = run_cli(["plan", str(cfg), "--dtype", "fp8", "--concurrency", "4", "--json"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["fits"] is True and doc["layout"]["tensor_parallel"] == 8
    assert doc["gpu"]["source"] and doc["gpu"]["date"]
    assert "--tensor-parallel-size" in doc["vllm_args"]
    assert all(f["source"] for f in doc["memory"] + doc["speed"])
    r = run_cli(["plan", str(cfg), "--concurrency", "16"])
    assert r.returncode == 1
    assert "does not fit" in r.stdout and "short by" in r.stdout and "GB per GPU" in r.stdout
    r = run_cli(["plan", str(cfg), "--json"])
    assert r.returncode == 1 and json.loads(r.stdout)["shortfall"].startswith("does not fit")


def test_cli_table_and_custom_gpu_figures() -> None:
    cfg = CONFIGS / "llama-3-70b.json"
    r = run_cli(["plan", str(cfg), "--gpu", "custom", "--gpu-mem", "96GB",
                 "--gpu-bandwidth", "4TB/s", "--gpu-bf16-tflops", "800", "--nvlink-domain",
                 "4", "--gpus-per-node", "4", "--training"])
    assert r.returncode == 0, r.stderr
    for part in ("Memory", "Layout: TP", "Speed (estimates", "ridge point", "What to run: vllm",
                 "training state", "operator-supplied"):
        assert part in r.stdout, part
    assert "│ 200 FLOP/byte" in r.stdout  # 800 TFLOP/s / 4 TB/s


@pytest.mark.parametrize(("args", "words"), [
    (["--gpu", "v100"], "unknown GPU type"),
    (["--gpu", "custom", "--gpu-mem", "80GB"], "--gpu custom needs"),
    (["--intra", "carrier-pigeon"], "nvlink or pcie"),
    (["--inter", "token-ring"], "unknown interconnect"),
    (["--dtype", "fp7"], "unknown dtype"),
    (["--from", "/nonexistent"], "needs --lock"),
])
def test_cli_bad_input_is_one_line_exit_2(args: list[str], words: str) -> None:
    r = run_cli(["plan", str(CONFIGS / "llama-3-70b.json"), *args])
    assert r.returncode == 2
    assert words in r.stderr and "Traceback" not in r.stderr


def test_cli_reads_safetensors_headers_of_a_local_dir(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_cfg("llama-3.1-8b")))
    (tmp_path / "a.safetensors").write_bytes(make_safetensors(
        {"w": ("F8_E4M3", (1000, 1000)), "n": ("BF16", (10,))}))
    r = run_cli(["plan", str(tmp_path), "--json"])
    assert r.returncode == 0, r.stderr
    figs = {f["name"]: f for f in json.loads(r.stdout)["memory"]}
    assert figs["parameters"]["value"] == 1_000_010
    assert figs["weights"]["value"] == 1_000_020
    assert "--quantization" not in json.loads(
        run_cli(["plan", str(tmp_path), "--dtype", "fp8", "--json"]).stdout)["vllm_args"]


def test_cli_hub_repo_id_and_lockfile_entry(hub_server: HubServer, tmp_path: Path) -> None:
    r = run_cli(["plan", SHARDED, "--gpu", "l40s", "--json"], endpoint=hub_server.url)
    assert r.returncode == 0, r.stderr
    figs = {f["name"]: f for f in json.loads(r.stdout)["memory"]}
    assert figs["parameters"]["value"] == 256 * 64 * 2 + 64 * 64 * 2 + 64
    lock = tmp_path / "weights.lock"
    assert run_cli(["pin", SHARDED, "--lock", str(lock)], endpoint=hub_server.url).returncode == 0
    r = run_cli(["plan", SHARDED, "--lock", str(lock), "--helm-values"], endpoint=hub_server.url)
    assert r.returncode == 0, r.stderr
    commit = json.loads(lock.read_text())["models"][0]["commit"]
    assert f"revision: {commit}" in r.stdout and f"servedModelName: {SHARDED}" in r.stdout
    # From a pulled copy, offline; a changed config.json is refused against the lock.
    into = tmp_path / "m"
    assert run_cli(["pull", "--lock", str(lock), "--into", str(into)],
                   endpoint=hub_server.url).returncode == 0
    r = run_cli(["plan", SHARDED, "--lock", str(lock), "--from", str(into), "--json"])
    assert r.returncode == 0, r.stderr
    cfg = into / "config.json"
    cfg.chmod(0o644)
    cfg.write_text(cfg.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 3'))
    r = run_cli(["plan", SHARDED, "--lock", str(lock), "--from", str(into)])
    assert r.returncode == 1 and "config.json" in r.stderr and "sha256" in r.stderr


def test_cli_helm_values_from_an_hf_cache_snapshot_names_repo_and_commit(tmp_path: Path) -> None:
    snap = tmp_path / "models--meta-llama--Llama-3.1-8B" / "snapshots" / ("c" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(_cfg("llama-3.1-8b")))
    r = run_cli(["plan", str(snap), "--helm-values", "--concurrency", "64", "--goal", "cost"])
    assert r.returncode == 0, r.stderr
    model = yaml.safe_load(r.stdout)["vllm"]["models"][0]
    assert model["servedModelName"] == "meta-llama/Llama-3.1-8B"
    assert model["revision"] == "c" * 40 and model["name"] == "llama-3-1-8b"
    assert (model["replicas"], model["tensorParallelSize"]) == (8, 1)
    assert model["extraArgs"][:2] == ["--max-num-seqs", "8"]


def test_cli_helm_values_refuses_multi_node_and_unpinned() -> None:
    cfg = CONFIGS / "llama-3.1-405b.json"
    r = run_cli(["plan", str(cfg), "--nodes", "2", "--helm-values", "--served-model-name",
                 "meta-llama/Llama-3.1-405B", "--commit", "a" * 40])
    assert r.returncode == 2 and "one pod per replica" in r.stderr
    r = run_cli(["plan", str(CONFIGS / "llama-3-70b.json"), "--helm-values"])
    assert r.returncode == 2 and "repo id" in r.stderr
    r = run_cli(["plan", str(CONFIGS / "llama-3-70b.json"), "--helm-values",
                 "--served-model-name", "meta-llama/Meta-Llama-3-70B", "--commit", "main"])
    assert r.returncode == 2 and "40-hex commit" in r.stderr


def test_local_and_pinned_offline_plans_make_no_network_connection(tmp_path: Path) -> None:
    from tests.weights.test_weights_egress import _guarded

    (tmp_path / "config.json").write_text(json.dumps(_cfg("llama-3-70b")))
    out = _guarded(["plan", str(tmp_path), "--json"])
    assert out == {"code": 0, "events": [], "loaded": []}
    out = _guarded(["plan", str(CONFIGS / "llama-3.1-405b.json"), "--helm-values",
                    "--served-model-name", "meta-llama/Llama-3.1-405B", "--commit", "a" * 40,
                    "--dtype", "fp8"])
    assert out == {"code": 0, "events": [], "loaded": []}


def test_cli_a_path_with_lock_says_target_is_the_pinned_repo_id(tmp_path: Path) -> None:
    """``weights plan model/config.json --lock weights.lock`` (a reader adding ``--lock`` as
    the ``--helm-values`` hint asks) said ``model/config.json is not pinned in the lockfile
    (hint: run `weights pin model/config.json` first)``: a file name to pin on the hub. It now
    says what TARGET is with ``--lock``, names what the lock pins and the command that works."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(_cfg("llama-3.1-8b")))
    lock = tmp_path / "weights.lock"
    locked = run_cli(["lock", str(model), "--repo-id", "acme/model", "--lock", str(lock)])
    assert locked.returncode == 0, locked.stderr
    r = run_cli(["plan", str(model / "config.json"), "--lock", str(lock), "--helm-values"])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = r.stderr.splitlines()
    assert "weights pin" not in line, line
    assert "TARGET is a repo id pinned in" in line and "acme/model" in line, line
    assert f"--from {model})" in line, line
    hinted = run_cli(["plan", "acme/model", "--lock", str(lock), "--from", str(model),
                      "--helm-values"])
    assert hinted.returncode == 0, hinted.stderr
