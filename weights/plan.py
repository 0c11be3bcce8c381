"""Capacity plan: memory per GPU, the parallel layout, speed estimates and vLLM arguments.

Built on :mod:`weights.plan_model` (parameters, weights and KV cache bytes of the model, from
:func:`weights.memory.size_model`) and :mod:`weights.gpus` (accelerator figures). Formulas,
each reported with its figure:

* per GPU = weights / (TP x PP) + KV of the replica's sequences / (min(TP, KV heads) x PP)
  + engine overhead; it must fit in GPU memory x ``--gpu-memory-utilization``. KV heads are
  replicated when TP exceeds them (an MLA latent is one head: every TP rank holds it).
* Layout: TP inside one NVLink domain (all-reduce every layer), PP across domains or nodes
  (only activations cross), EP for MoE over the TP group, data-parallel replicas with the
  remaining GPUs; concurrency is spread over the replicas. The layouts that fit are ranked by
  the workload's goal (:data:`GOALS`; :func:`weights.plan_speed.by_goal`), ties kept in the
  order least PP, replica in one node, smallest TP; the plan says why (``Plan.why``).
* Speed (estimates, roofline): :mod:`weights.plan_speed`.

The values (inputs, model facts, layouts, the plan) are in :mod:`weights.plan_types`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from weights.errors import SizingError
from weights.gpus import GpuSpec
from weights.plan_model import model_facts
from weights.plan_speed import by_goal
from weights.plan_types import GOALS, INTERCONNECTS, Cluster, Layout, ModelFacts, Plan, Workload
from weights.sizing import GB, Figure, ParamCount

#: Bytes of training state per parameter with mixed-precision Adam: BF16 weights (2) and
#: gradients (2), FP32 master weights (4), Adam first and second moments (4 + 4). Rajbhandari
#: et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (2020), sec. 3.1.
TRAINING_BYTES_PER_PARAM = 16

def _tp_ok(m: ModelFacts, tp: int) -> bool:
    # vLLM: heads divisible by TP; KV heads divisible by TP, or TP a multiple of them.
    if m.heads % tp:
        return False
    return m.kv_heads % tp == 0 or tp % m.kv_heads == 0


def _layout(m: ModelFacts, c: Cluster, w: Workload, tp: int, pp: int) -> Layout:
    per_replica = tp * pp
    replicas = c.total_gpus // per_replica
    seqs = math.ceil(w.concurrency / replicas)
    kv_split = min(tp, m.kv_heads) * pp
    wpg = m.weights_bytes / per_replica
    kvpg = m.kv_per_seq * seqs / kv_split
    ep = bool(w.expert_parallel and m.experts and tp > 1 and m.experts % tp == 0)
    return Layout(tp=tp, pp=pp, ep=ep, replicas=replicas, seqs_per_replica=seqs,
                  nodes_per_replica=max(1, per_replica // c.gpus_per_node),
                  weights_per_gpu=wpg, kv_per_gpu=kvpg,
                  needed_per_gpu=wpg + kvpg + w.overhead_bytes,
                  usable_per_gpu=c.gpu.memory_bytes * w.utilization)


def tensor_parallel_ok(m: ModelFacts, tp: int) -> bool:
    """Whether vLLM accepts tensor-parallel degree ``tp`` for the model's head counts."""
    return _tp_ok(m, tp)


def replica_layout(m: ModelFacts, gpu: GpuSpec, w: Workload, tp: int) -> Layout:
    """One replica on ``tp`` GPUs (TP ``tp``, PP 1) serving all ``w.concurrency`` sequences:
    the layout ``weights size`` reports, computed as every layout of the plan is."""
    return _layout(m, Cluster(gpu, tp, 1), w, tp, 1)


def candidates(m: ModelFacts, c: Cluster, w: Workload) -> list[Layout]:
    """Every placeable (TP, PP) split, fitting or not, in preference order.

    TP: powers of two up to the NVLink domain that vLLM accepts for the head counts. PP: a
    replica fills a divisor of a node or whole nodes, with at most one stage per layer.
    """
    out = []
    G = c.gpus_per_node
    tp = 1
    while tp <= c.domain:
        if _tp_ok(m, tp):
            for pp in range(1, min(m.layers, c.total_gpus // tp) + 1):
                g = tp * pp
                if (g <= G and G % g == 0) or (g % G == 0 and g // G <= c.nodes):
                    out.append(_layout(m, c, w, tp, pp))
        tp *= 2
    out.sort(key=lambda lay: (lay.pp, lay.nodes_per_replica, lay.tp, -lay.left_per_gpu))
    return out


def _reasons(m: ModelFacts, c: Cluster, lay: Layout) -> tuple[str, ...]:
    gb = m.weights_bytes / GB
    link = "NVLink" if c.domain > 1 else "PCIe (no NVLink domain)"
    if lay.tp == 1:
        tp = "TP 1: one GPU per stage holds its share; no all-reduce"
    else:
        tp = (f"TP {lay.tp}: inside one {link} group of {c.domain} GPUs "
              "(TP all-reduces every layer, so it stays on the fastest link)")
    if lay.pp == 1:
        pp = f"PP 1: {gb:,.1f} GB of weights fit on the TP group; no pipeline bubbles"
    else:
        where = (f"across {lay.nodes_per_replica} nodes over {c.inter}"
                 if lay.nodes_per_replica > 1 else "inside the node over PCIe")
        pp = (f"PP {lay.pp}: {gb:,.1f} GB of weights and the KV cache need {lay.pp} groups of "
              f"{lay.tp}; stages {where} (only activations cross)")
    if not m.experts:
        ep = "EP off: dense model"
    elif lay.ep:
        ep = (f"EP on: {m.experts} experts sharded over the {lay.tp} TP ranks "
              f"(all-to-all inside the {link} group)")
    else:
        ep = ("EP off: " + ("TP is 1" if lay.tp == 1 else
                            f"{m.experts} experts do not divide over {lay.tp} ranks"
                            if m.experts % lay.tp else "disabled (--no-expert-parallel)"))
    dp = (f"DP {lay.replicas}: {c.total_gpus} GPUs / {lay.gpus_per_replica} per replica; "
          f"each serves {lay.seqs_per_replica} of the sequences")
    return tp, pp, ep, dp


def make_plan(config: Mapping[str, Any], params: ParamCount | None, cluster: Cluster,
              work: Workload) -> Plan:
    """Plan ``config`` (and its safetensors counts, if any) on ``cluster`` for ``work``.

    Raises:
        SizingError: Bad config, dtype, or cluster figures.
    """
    if cluster.gpus_per_node < 1 or cluster.nodes < 1:
        raise SizingError("gpus per node and nodes must be at least 1")
    if cluster.inter not in INTERCONNECTS:
        raise SizingError(f"unknown interconnect {cluster.inter!r} "
                          f"(known: {', '.join(INTERCONNECTS)})")
    if work.goal not in GOALS:
        raise SizingError(f"goal {work.goal!r}: one of {', '.join(GOALS)}")
    m = model_facts(config, params, work)
    cands = candidates(m, cluster, work)
    fitting = [lay for lay in cands if lay.fits]
    ranked = [replace(lay, reasons=_reasons(m, cluster, lay)) for lay in fitting]
    closest = None
    more = None
    if not fitting:
        closest = max(cands, key=lambda lay: lay.left_per_gpu) if cands else None
        for n in range(cluster.nodes + 1, 65):
            bigger = Cluster(cluster.gpu, cluster.gpus_per_node, n, cluster.intra,
                             cluster.inter)
            if any(lay.fits for lay in candidates(m, bigger, work)):
                more = n
                break
    plan = Plan(notes=_notes(m, cluster, work), model=m, cluster=cluster, work=work,
                memory=(), layout=ranked[0] if ranked else None,
                alternatives=tuple(ranked[1:]), closest=closest, fits_on_nodes=more)
    if ranked:
        ranked, why = by_goal(plan, ranked, work.goal)
        plan = replace(plan, layout=ranked[0], alternatives=tuple(ranked[1:]), why=why)
    return replace(plan, memory=_memory(m, cluster, work, ranked[0] if ranked else closest))


def kv_total_figure(m: ModelFacts, w: Workload) -> Figure:
    """KV cache of all ``w.concurrency`` sequences of ``w.context`` tokens, bytes."""
    return Figure("kv cache for context x concurrency", m.kv_per_seq * w.concurrency,
                  "bytes", f"per sequence x {w.concurrency} (--concurrency)")


def gpu_figures(m: ModelFacts, c: Cluster, w: Workload, lay: Layout | None) -> list[Figure]:
    """The per-GPU memory figures of ``lay`` on ``c`` (shared by ``plan`` and ``size``)."""
    total = c.gpu.memory_bytes * c.total_gpus
    figs = [Figure("gpu memory total", total, "bytes",
                   f"{c.total_gpus} GPUs x {c.gpu.memory_bytes / GB:g} GB ({c.gpu.name})")]
    replicas = lay.replicas if lay else 1
    figs.append(Figure("left after weights", total - m.weights_bytes * replicas, "bytes",
                       f"gpu memory total - weights x {replicas} replica(s)"))
    figs.append(Figure("engine overhead per gpu", w.overhead_bytes, "bytes",
                       "estimate: activation peak, CUDA graphs, NCCL buffers (--overhead)"))
    if lay is not None:
        figs += [
            Figure("weights per gpu", lay.weights_per_gpu, "bytes",
                   f"weights / (TP {lay.tp} x PP {lay.pp})"),
            Figure("kv cache per gpu", lay.kv_per_gpu, "bytes",
                   f"per sequence x {lay.seqs_per_replica} sequences / (min(TP, KV heads "
                   f"{m.kv_heads}) x PP {lay.pp})"),
            Figure("usable per gpu", lay.usable_per_gpu, "bytes",
                   f"{c.gpu.memory_bytes / GB:g} GB x {w.utilization} "
                   "(--gpu-memory-utilization)"),
            Figure("left per gpu", lay.left_per_gpu, "bytes",
                   "usable - weights - kv cache - overhead (per gpu)")]
    return figs


def _memory(m: ModelFacts, c: Cluster, w: Workload, lay: Layout | None) -> tuple[Figure, ...]:
    figs = [*m.figures, kv_total_figure(m, w), *gpu_figures(m, c, w, lay)]
    if w.training:
        state = m.params * TRAINING_BYTES_PER_PARAM
        figs.append(Figure("training state (mixed-precision Adam)", state, "bytes",
                           "parameters x 16 bytes (2 weights + 2 grads + 4 master + 8 Adam; "
                           "ZeRO paper), before activations"))
        figs.append(Figure("training state per gpu, fully sharded", state / c.total_gpus,
                           "bytes", f"/ {c.total_gpus} GPUs (ZeRO-3 / FSDP)"))
    return tuple(figs)


def _notes(m: ModelFacts, c: Cluster, w: Workload) -> tuple[str, ...]:
    notes = []
    if m.max_context is not None and w.context > m.max_context:
        notes.append(f"--context {w.context} exceeds max_position_embeddings {m.max_context}: "
                     "vLLM refuses it without rope scaling or VLLM_ALLOW_LONG_MAX_MODEL_LEN=1")
    if m.weight_el_bytes <= 1 and c.gpu.fp8_flops is None:
        notes.append(f"{c.gpu.name} has no FP8 tensor cores: 1-byte weights are up-cast and "
                     "computed at the BF16 rate (weight-only quantization)")
    if c.gpu.gpu_resource != "nvidia.com/gpu":
        notes.append(f"{c.gpu.name}: run a vLLM build for this accelerator (e.g. the ROCm "
                     "image) and request its device resource "
                     f"({c.gpu.gpu_resource}, chart gpuResource)")
    if m.weight_el_bytes < 1:
        notes.append("sub-byte weights need a pre-quantized checkpoint (AWQ, GPTQ, ...): vLLM "
                      "does not quantize to 4 bits at load")
    return tuple(notes)
