"""The options ``weights size`` and ``weights plan`` share: one name, one default, one help.

Both commands answer "how much GPU memory does this model need for this workload"; they take
the workload the same way, with the defaults of :class:`weights.plan.Workload` (context 8192
tokens, 16 concurrent sequences, ``--gpu-memory-utilization`` 0.9, 2 GiB engine overhead per
GPU) and the GPU of ``--gpu`` (default H100 SXM) with ``--gpu-mem`` overriding its memory.
Old names stay as hidden aliases: ``--utilization`` (both commands) and ``--gpus`` (``size``,
now ``--gpus-per-node``).
"""

from __future__ import annotations

from typing import Annotated

import typer

from weights.gpus import GPUS
from weights.plan_types import Workload
from weights.sizing import GIB

__all__ = [
    "CONCURRENCY",
    "CONTEXT",
    "DEFAULT_GPU",
    "GPUS_PER_NODE",
    "OVERHEAD",
    "UTILIZATION",
    "ConcurrencyOpt",
    "ContextOpt",
    "DtypeOpt",
    "GpuMemOpt",
    "GpusPerNodeOpt",
    "KvDtypeOpt",
    "OverheadOpt",
    "UtilizationAliasOpt",
    "UtilizationOpt",
    "utilization_of",
]

_W = Workload()
#: The GPU both commands assume when ``--gpu`` is not given.
DEFAULT_GPU = "h100-sxm"

DtypeOpt = Annotated[str | None, typer.Option("--dtype", help="Deploy dtype: bf16, fp8...")]
KvDtypeOpt = Annotated[str | None, typer.Option("--kv-dtype", help="KV cache dtype.")]
ContextOpt = Annotated[int, typer.Option(
    "--context", min=1, help="Tokens per sequence (vLLM --max-model-len).")]
ConcurrencyOpt = Annotated[int, typer.Option(
    "--concurrency", min=1, help="Concurrent sequences (over all replicas).")]
UtilizationOpt = Annotated[float, typer.Option(
    "--gpu-memory-utilization", min=0.05, max=1.0, help="vLLM's memory fraction.")]
UtilizationAliasOpt = Annotated[float | None, typer.Option(
    "--utilization", min=0.05, max=1.0, hidden=True)]
OverheadOpt = Annotated[str, typer.Option("--overhead", help="Engine overhead per GPU.")]
GpuMemOpt = Annotated[str | None, typer.Option(
    "--gpu-mem", help="GPU memory, overrides --gpu's: 80 (GiB), 80GiB or 80GB.")]
GpusPerNodeOpt = Annotated[int, typer.Option("--gpus-per-node", min=1, help="GPUs in a node.")]

CONTEXT = _W.context
CONCURRENCY = _W.concurrency
UTILIZATION = _W.utilization
OVERHEAD = f"{_W.overhead_bytes // GIB}GiB"
GPUS_PER_NODE = 8
if DEFAULT_GPU not in GPUS:  # pragma: no cover - a table edit would break both commands
    raise RuntimeError(f"{DEFAULT_GPU} is not in weights.gpus.GPUS")


def utilization_of(value: float, alias: float | None) -> float:
    """``--gpu-memory-utilization``, or the old ``--utilization`` when that was given."""
    return alias if alias is not None else value
