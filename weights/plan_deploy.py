"""What to run for a plan: vLLM arguments and the chart's in-chart vLLM values block.

The values block matches ``helm/sovereign-gateway`` (``vllm.models[]``: ``tensorParallelSize``,
``pipelineParallelSize``, ``maxModelLen``, ``replicas``, ``gpuResource``, ``extraArgs``) and is
validated by the chart's ``values.schema.json`` when passed to ``helm install -f``. The chart
runs one pod per replica, so a replica must fit in one node.
"""

from __future__ import annotations

import re
from typing import Any

from weights.errors import SizingError
from weights.plan_types import Layout, Plan

_KV_CACHE_DTYPES = {"fp8": "fp8", "float8": "fp8", "fp8_e4m3": "fp8_e4m3",
                    "fp8_e5m2": "fp8_e5m2"}
_SIXTEEN_BIT = {"bf16", "bfloat16", "fp16", "float16", "half"}


def kv_cache_dtype(kv_dtype: str | None) -> str:
    """vLLM ``--kv-cache-dtype`` for a KV dtype (None or 16-bit: ``auto``, the model dtype).

    Raises:
        SizingError: A KV dtype vLLM cannot store (int8, int4, fp32).
    """
    if kv_dtype is None:
        return "auto"
    key = kv_dtype.lower().removeprefix("torch.")
    if key in _SIXTEEN_BIT:
        return "auto"
    if key in _KV_CACHE_DTYPES:
        return _KV_CACHE_DTYPES[key]
    raise SizingError(f"--kv-dtype {kv_dtype}: vLLM's --kv-cache-dtype takes auto (16-bit) or "
                      "fp8, fp8_e4m3, fp8_e5m2")


def vllm_args(plan: Plan, lay: Layout, *, stored_fp8: bool) -> list[str]:
    """The vLLM server arguments of ``lay`` (``vllm serve MODEL <these>``).

    Args:
        plan: The plan.
        lay: Its chosen (or an alternative) layout.
        stored_fp8: The checkpoint already holds FP8 weights (no on-the-fly quantization).
    """
    w = plan.work
    args = ["--tensor-parallel-size", str(lay.tp), "--pipeline-parallel-size", str(lay.pp)]
    if lay.ep:
        args.append("--enable-expert-parallel")
    args += ["--max-model-len", str(w.context), "--max-num-seqs", str(lay.seqs_per_replica),
             "--gpu-memory-utilization", f"{w.utilization:g}",
             "--kv-cache-dtype", kv_cache_dtype(w.kv_dtype)]
    if w.dtype and w.dtype.lower().startswith(("fp8", "float8")) and not stored_fp8:
        args += ["--quantization", "fp8"]  # dynamic FP8 weights from a 16-bit checkpoint
    return args


def chart_name(repo_id: str) -> str:
    """A DNS-1035 label for ``vllm.models[].name`` from a repo id (``org/Llama-3.1-8B``)."""
    name = re.sub(r"[^a-z0-9-]+", "-", repo_id.rsplit("/", 1)[-1].lower()).strip("-")
    name = re.sub(r"-+", "-", name)
    if not name or not name[0].isalpha():
        name = f"m-{name}".rstrip("-")
    return name[:40].rstrip("-")


def helm_values(plan: Plan, lay: Layout, *, served_model_name: str, revision: str,
                name: str, store_claim: str, stored_fp8: bool) -> dict[str, Any]:
    """The ``vllm`` values block for the chart's in-chart vLLM backend.

    Raises:
        SizingError: A replica spans nodes (the chart runs one pod per replica), or the
            revision is not a pinned 40-hex commit, or the name is not a DNS-1035 label.
    """
    if lay.gpus_per_replica > plan.cluster.gpus_per_node:
        raise SizingError(
            f"the plan needs {lay.nodes_per_replica} nodes per replica (TP {lay.tp} x PP "
            f"{lay.pp}); the chart's in-chart vLLM runs one pod per replica on one node",
            hint="run it with a multi-node launcher (Ray, LeaderWorkerSet) and point "
                 "gateway.models at it, or plan with more GPUs per node / FP8")
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        raise SizingError(f"--helm-values needs a pinned 40-hex commit, got {revision!r}",
                          hint="pass --lock weights.lock or --commit <40 hex>")
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) or len(name) > 40:
        raise SizingError(f"--name {name!r} is not a DNS-1035 label of at most 40 characters")
    extra = vllm_args(plan, lay, stored_fp8=stored_fp8)
    # --tensor-parallel-size and --max-model-len are explicit chart keys; keep the rest.
    skip = {"--tensor-parallel-size", "--pipeline-parallel-size", "--max-model-len"}
    rest: list[str] = []
    it = iter(extra)
    for a in it:
        if a in skip:
            next(it)
        else:
            rest.append(a)
    model: dict[str, Any] = {
        "name": name, "servedModelName": served_model_name, "revision": revision,
        "storeClaim": store_claim, "replicas": lay.replicas,
        "tensorParallelSize": lay.tp, "pipelineParallelSize": lay.pp,
        "gpuResource": plan.cluster.gpu.gpu_resource, "maxModelLen": plan.work.context,
        "extraArgs": rest,
    }
    return {"vllm": {"enabled": True, "models": [model]}}
