"""In-chart vLLM: pipelineParallelSize, and `weights plan --helm-values` output rendered by helm.

The plan's values block is passed to the real ``helm template -f`` on top of the vllm scenario
(whose egress policy already allows ``vllm-llama-3-3-70b``), so the chart's values.schema.json
validates it and the rendered Deployment carries the plan's arguments and GPU count.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sg_helm as h
import yaml

from tests.weights.cli_util import run_cli

CONFIGS = h.REPO / "tests" / "weights" / "configs"
COMMIT = "6f6073b423013f6a7d4d9f39144961bfbfbc386b"
SERVED = "meta-llama/Llama-3.3-70B-Instruct"


def _deployment(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return h.one(objs, "Deployment", f"sg-sovereign-gateway-vllm-{name}")["spec"]


def _only_the_70b(tmp_path: Path) -> tuple[Path, Path]:
    """The vllm scenario's egress values and policy without the 8B model's destination (the
    plan's block replaces vllm.models with the one planned model)."""
    egress = yaml.safe_load(h.SCENARIOS["vllm"].read_text())["egress"]
    egress["destinations"] = [d for d in egress["destinations"]
                              if d["id"] != "vllm-llama-3-1-8b"]
    values = tmp_path / "egress.yaml"
    values.write_text(yaml.safe_dump({"egress": egress}))
    policy = yaml.safe_load(h.SCENARIO_POLICIES["vllm"].read_text())
    policy["destinations"] = [d for d in policy["destinations"]
                              if d["id"] != "vllm-llama-3-1-8b"]
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy))
    return values, policy_file


def _plan_values(tmp_path: Path, *extra: str) -> tuple[Path, dict[str, Any]]:
    args = ["plan", str(CONFIGS / "llama-3-70b.json"), "--gpu", "h100-sxm", *extra]
    r = run_cli([*args, "--json"])
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    r = run_cli([*args, "--helm-values", "--name", "llama-3-3-70b", "--served-model-name",
                 SERVED, "--commit", COMMIT])
    assert r.returncode == 0, r.stderr
    out = tmp_path / "plan-values.yaml"
    out.write_text(r.stdout, encoding="utf-8")
    return out, plan


def test_pipeline_parallel_size_multiplies_the_gpus_and_adds_the_argument(
        tmp_path: Path) -> None:
    values = tmp_path / "pp.yaml"
    doc = yaml.safe_load(h.SCENARIOS["vllm"].read_text())
    doc["vllm"]["models"][1]["pipelineParallelSize"] = 2
    values.write_text(yaml.safe_dump(doc))
    objs = h.render(h.SCENARIOS["vllm"], values)
    spec = h.one(objs, "StatefulSet", "sg-sovereign-gateway-vllm-llama-3-3-70b")["spec"]
    c = spec["template"]["spec"]["containers"][0]
    i = c["args"].index("--pipeline-parallel-size")
    assert c["args"][i + 1] == "2"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8  # TP 4 x PP 2
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 8
    # Without it, no argument and GPUs = TP (the golden renders are unchanged).
    objs = h.render(h.SCENARIOS["vllm"])
    c = h.one(objs, "StatefulSet", "sg-sovereign-gateway-vllm-llama-3-3-70b")[
        "spec"]["template"]["spec"]["containers"][0]
    assert "--pipeline-parallel-size" not in c["args"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    doc["vllm"]["models"][1]["pipelineParallelSize"] = 0
    values.write_text(yaml.safe_dump(doc))
    assert "pipelineParallelSize" in h.refuse(h.SCENARIOS["vllm"], values)


def test_plan_helm_values_render_with_the_plans_layout(tmp_path: Path) -> None:
    values, plan = _plan_values(tmp_path, "--concurrency", "32", "--context", "8192",
                                "--kv-dtype", "fp8")
    lay = plan["layout"]
    egress, policy = _only_the_70b(tmp_path)
    objs = h.render(h.SCENARIOS["vllm"], egress, values, policy=policy)
    spec = _deployment(objs, "llama-3-3-70b")
    assert spec["replicas"] == lay["replicas"]
    c = spec["template"]["spec"]["containers"][0]
    args = c["args"]
    assert args[args.index("--revision") + 1] == COMMIT
    assert args[args.index("--tensor-parallel-size") + 1] == str(lay["tensor_parallel"])
    assert args[args.index("--max-model-len") + 1] == "8192"
    assert args[args.index("--max-num-seqs") + 1] == str(lay["max_num_seqs"])
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.9"
    gpus = lay["tensor_parallel"] * lay["pipeline_parallel"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == gpus
    # The plan's arguments all reach the container (the chart adds --model, --port, ...).
    for flag in plan["vllm_args"]:
        if flag.startswith("--") and flag != "--pipeline-parallel-size":
            assert flag in args, flag


def test_plan_helm_values_are_checked_by_the_chart_schema(tmp_path: Path) -> None:
    values, _ = _plan_values(tmp_path)
    doc = yaml.safe_load(values.read_text())
    doc["vllm"]["models"][0]["tensorParalelSize"] = 2  # a typo must not pass silently
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    egress, policy = _only_the_70b(tmp_path)
    assert h.render(h.SCENARIOS["vllm"], egress, values, policy=policy)
    assert "tensorParalelSize" in h.refuse(h.SCENARIOS["vllm"], egress, bad, policy=policy)
