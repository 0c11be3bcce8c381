"""The options ``weights size`` and ``weights plan`` share: one name, one default, one help.

Both commands answer "how much GPU memory does this model need for this workload"; they take
the workload the same way, with the defaults of :class:`weights.plan.Workload` (context 8192
tokens, 16 concurrent sequences, ``--gpu-memory-utilization`` 0.9, 2 GiB engine overhead per
GPU) and the GPU of ``--gpu`` (default H100 SXM) with ``--gpu-mem`` overriding its memory.
Old names stay as hidden aliases: ``--utilization`` (both commands) and ``--gpus`` (``size``,
now ``--gpus-per-node``); an old name and its new one on one command line are a usage error
(:func:`aliased`), not a silent choice.
"""

from __future__ import annotations

from typing import Annotated, TypeVar

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
    "aliased",
]

_T = TypeVar("_T")

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


def aliased(ctx: typer.Context, param: str, value: _T, alias: _T | None,
            flag: str, old_flag: str) -> _T:
    """The value of a flag that has a hidden old name: the old one's when only it was given.

    Args:
        ctx: The command's context (tells a flag given from its default).
        param: The new flag's parameter name in the command (``utilization``).
        value: The new flag's value (its default when not given).
        alias: The old flag's value, ``None`` when not given.
        flag: The new flag (``--gpu-memory-utilization``), for the error.
        old_flag: The old flag (``--utilization``), for the error.

    Raises:
        typer.BadParameter: Both were given (exit 2, the shared CLI boundary's usage error):
            which to believe is the user's call, even when the values agree.
    """
    if alias is None:
        return value
    # typer carries its own copy of click: the source enum is compared by its name, which is
    # click's public API, not by importing typer's private module.
    source = ctx.get_parameter_source(param)
    if source is not None and source.name == "COMMANDLINE":
        raise typer.BadParameter(
            f"{old_flag} is the old name of {flag}: give only {flag}", param_hint=old_flag)
    return alias
