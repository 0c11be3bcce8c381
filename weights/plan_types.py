"""The values of a capacity plan: its inputs, the model's facts, the layouts, the plan.

A leaf of the plan modules: :mod:`weights.plan` (layouts and ranking), :mod:`weights.plan_model`
(model facts), :mod:`weights.plan_speed` (speed estimates) and :mod:`weights.plan_deploy`
(vLLM arguments) import it and none of them is imported back (no import circle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from weights.gpus import GpuSpec
from weights.sizing import GB, GIB, Figure

__all__ = ["GOALS", "INTERCONNECTS", "Cluster", "Layout", "ModelFacts", "Plan", "Workload"]

INTERCONNECTS = ("infiniband", "roce", "ethernet")


@dataclass(frozen=True)
class Cluster:
    """The GPUs to plan for.

    Attributes:
        gpu: Accelerator figures.
        gpus_per_node: GPUs in one node.
        nodes: Nodes.
        intra: ``nvlink`` (the GPU's NVLink domain) or ``pcie`` (no GPU-to-GPU link used).
        inter: Network between nodes: ``infiniband``, ``roce`` or ``ethernet``.
    """

    gpu: GpuSpec
    gpus_per_node: int = 8
    nodes: int = 1
    intra: str = "nvlink"
    inter: str = "infiniband"

    @property
    def total_gpus(self) -> int:
        """GPUs in the cluster."""
        return self.gpus_per_node * self.nodes

    @property
    def domain(self) -> int:
        """GPUs sharing one NVLink domain inside a node (1 over PCIe only)."""
        if self.intra == "pcie":
            return 1
        return max(1, min(self.gpu.nvlink_domain, self.gpus_per_node))


@dataclass(frozen=True)
class Workload:
    """What to serve: dtypes, context, concurrency, memory fraction, overhead.

    Attributes:
        dtype: Deploy dtype of the weights (None: as stored / ``torch_dtype``).
        kv_dtype: KV cache dtype (None: the model dtype, vLLM ``--kv-cache-dtype auto``).
        context: Tokens per sequence (prompt + output), vLLM ``--max-model-len``.
        concurrency: Concurrent sequences over the whole cluster.
        utilization: vLLM ``--gpu-memory-utilization``.
        overhead_bytes: Per-GPU engine overhead (activations of the profiling run, CUDA
            graphs, communication buffers); vLLM measures it at start-up, this is an estimate.
        training: Also report the mixed-precision Adam training state.
        expert_parallel: Allow expert parallelism for MoE models.
    """

    dtype: str | None = None
    kv_dtype: str | None = None
    context: int = 8192
    concurrency: int = 16
    utilization: float = 0.9
    overhead_bytes: int = 2 * GIB
    training: bool = False
    expert_parallel: bool = True
    goal: str = "throughput"


#: What a plan optimises (``weights plan --goal``): the most decode tokens/s over all
#: replicas, the fastest tokens/s per sequence at the stated concurrency, or the fewest GPUs
#: per replica (the rest left for other models).
GOALS = ("throughput", "latency", "cost")


@dataclass(frozen=True)
class Layout:
    """One way to split the model over the cluster, with its per-GPU memory (bytes)."""

    tp: int
    pp: int
    ep: bool
    replicas: int
    seqs_per_replica: int
    nodes_per_replica: int
    weights_per_gpu: float
    kv_per_gpu: float
    needed_per_gpu: float
    usable_per_gpu: float
    reasons: tuple[str, ...] = field(default=(), compare=False)

    @property
    def gpus_per_replica(self) -> int:
        """TP x PP."""
        return self.tp * self.pp

    @property
    def left_per_gpu(self) -> float:
        """Usable memory minus what the layout needs, bytes (negative: does not fit)."""
        return self.usable_per_gpu - self.needed_per_gpu

    @property
    def fits(self) -> bool:
        """Whether weights, KV and overhead fit in the usable memory of every GPU."""
        return self.left_per_gpu >= 0

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (bytes as numbers)."""
        return {"tensor_parallel": self.tp, "pipeline_parallel": self.pp,
                "expert_parallel": self.ep, "replicas": self.replicas,
                "gpus_per_replica": self.gpus_per_replica,
                "nodes_per_replica": self.nodes_per_replica,
                "max_num_seqs": self.seqs_per_replica,
                "weights_per_gpu_bytes": self.weights_per_gpu,
                "kv_per_gpu_bytes": self.kv_per_gpu, "needed_per_gpu_bytes": self.needed_per_gpu,
                "usable_per_gpu_bytes": self.usable_per_gpu,
                "left_per_gpu_bytes": self.left_per_gpu, "fits": self.fits,
                "reasons": list(self.reasons)}


@dataclass(frozen=True)
class ModelFacts:
    """Figures of the model that do not depend on the layout (bytes, params, tokens)."""

    params: float
    active_params: float
    weights_bytes: float
    weight_el_bytes: float
    kv_per_token: float
    kv_per_seq: float
    kv_heads: int
    heads: int
    layers: int
    experts: int
    experts_per_tok: int
    routed_expert_params: float
    embedding_params: float
    max_context: int | None
    figures: tuple[Figure, ...]


@dataclass(frozen=True)
class Plan:
    """The capacity plan: model facts, memory figures, chosen layout and ranked alternatives.

    Attributes:
        layout: The chosen layout (None when nothing fits).
        alternatives: Other fitting layouts, in preference order.
        closest: When nothing fits, the split with the smallest shortfall per GPU.
        fits_on_nodes: When nothing fits, the fewest nodes of this kind that would fit
            (None if not within 64 nodes).
        notes: Caveats of the inputs (context beyond the model's, no FP8 tensor cores, ...).
        why: Why the chosen layout, by the workload's goal (with the runner-up's figure).
    """

    model: ModelFacts
    cluster: Cluster
    work: Workload
    memory: tuple[Figure, ...]
    layout: Layout | None
    alternatives: tuple[Layout, ...]
    closest: Layout | None
    fits_on_nodes: int | None
    notes: tuple[str, ...] = ()
    why: str = ""

    @property
    def fits(self) -> bool:
        """Whether some layout fits the cluster."""
        return self.layout is not None

    def shortfall(self) -> str:
        """One line saying by how much the model misses the cluster ("" if it fits)."""
        if self.layout is not None or self.closest is None:
            return ""
        lay = self.closest
        short = -lay.left_per_gpu
        more = (f"; it fits on {self.fits_on_nodes} nodes of {self.cluster.gpus_per_node}"
                if self.fits_on_nodes else "")
        return (f"does not fit: the closest split (TP {lay.tp} x PP {lay.pp}) needs "
                f"{lay.needed_per_gpu / GB:,.1f} GB per GPU and "
                f"{lay.usable_per_gpu / GB:,.1f} GB is usable: short by {short / GB:,.1f} GB "
                f"per GPU ({short * lay.gpus_per_replica / GB:,.1f} GB over "
                f"{lay.gpus_per_replica} GPUs){more}")
