"""``weights plan``: from a model and a cluster to a layout, vLLM arguments and chart values.

Registered on the app by :mod:`weights.cli`. Exit 0: it fits; 1: it does not fit (the report
says by how much); 2: usage or input error. Only a hub REPO_ID (without ``--from``) reads the
network, through :mod:`weights.hub`.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from clishell.consoles import print_wrapped
from clishell.consoles import table as _table
from weights.cli_common import (
    EndpointOpt,
    JsonOpt,
    OfflineOpt,
    RedirectHostOpt,
    TokenOpt,
    VerificationFailed,
    diagnostics_console,
    hub_client,
)
from weights.cli_common import console as _console
from weights.cli_extra import _human, _local_inputs, _remote_inputs, is_repo_id, missing_target
from weights.cli_workload import (
    CONCURRENCY,
    CONTEXT,
    DEFAULT_GPU,
    GPUS_PER_NODE,
    OVERHEAD,
    UTILIZATION,
    ConcurrencyOpt,
    ContextOpt,
    DtypeOpt,
    GpuMemOpt,
    GpusPerNodeOpt,
    KvDtypeOpt,
    OverheadOpt,
    UtilizationAliasOpt,
    UtilizationOpt,
    aliased,
)
from weights.errors import DigestMismatchError, SizingError
from weights.gpus import GPUS, custom_gpu, gpu_spec, with_overrides
from weights.lockfile import Lockfile
from weights.memory import parse_memory
from weights.plan import make_plan
from weights.plan_deploy import chart_name, helm_values, vllm_args
from weights.plan_speed import aggregate_tokens_s, speed
from weights.plan_types import INTERCONNECTS, Cluster, Layout, Plan, Workload
from weights.sizing import ParamCount

_SNAPSHOT = re.compile(
    r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})")


def _tflops(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not v > 0:
        raise SizingError(f"{flag} {text!r}: a positive number of TFLOP/s")
    return v * 1e12


def _bandwidth(text: str | None) -> float | None:
    """``3.35TB/s``, ``3350GB/s`` or a bare number of TB/s."""
    if text is None:
        return None
    t = text.strip().lower().removesuffix("/s")
    return float(parse_memory(t if t[-1:] == "b" else f"{t}TB"))


def _model_inputs(
    target: str, lock: Path | None, source: Path | None, revision: str, endpoint: str,
    token: str | None, redirect_host: list[str] | None = None, offline: bool = False,
) -> tuple[dict[str, Any], ParamCount | None, str | None, str | None]:
    """(config, parameter counts, repo id, pinned commit) from the TARGET given."""
    if lock is not None:
        lockfile = Lockfile.load(lock)
        if lockfile.get(target) is None and Path(target).exists():
            names = ", ".join(e.repo_id for e in lockfile.entries) or "no model"
            directory = Path(target).parent if Path(target).is_file() else Path(target)
            raise SizingError(
                f"{target}: with --lock, TARGET is a repo id pinned in {lock} "
                f"(it pins {names}), not a path",
                hint=f"weights plan REPO_ID --lock {lock} --from {directory}")
        entry = lockfile.entry(target)
        if source is not None:
            from weights.cache import resolve_model_dir

            path = resolve_model_dir(source, entry)
            raw = (path / "config.json").read_bytes()
            config, params = _local_inputs(path)
        else:
            hub = hub_client(endpoint, token, redirect_host, offline)
            config, params = _remote_inputs(hub, entry.repo_id, entry.commit)
            cfg_file = entry.get("config.json")
            raw = hub.read_range(entry.repo_id, entry.commit, "config.json", 0,
                                 cfg_file.size) if cfg_file else b""
        pinned = entry.get("config.json")
        if pinned is not None and hashlib.sha256(raw).hexdigest() != pinned.sha256:
            raise DigestMismatchError(f"{entry.repo_id}/config.json",
                                      f"sha256:{pinned.sha256}",
                                      f"sha256:{hashlib.sha256(raw).hexdigest()}")
        return config, params, entry.repo_id, entry.commit
    path = Path(target)
    if path.exists():
        config, params = _local_inputs(path)
        m = _SNAPSHOT.search(path.resolve().as_posix())
        if m:
            return config, params, f"{m['org']}/{m['name']}", m["commit"]
        return config, params, None, None
    if is_repo_id(target):
        hub = hub_client(endpoint, token, redirect_host, offline)
        commit = hub.snapshot(target, revision).commit
        config, params = _remote_inputs(hub, target, commit)
        return config, params, target, commit
    raise missing_target(target)


def plan(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(
        help="Model dir / config.json, a REPO_ID on the hub, or (with --lock) a pinned REPO_ID.")],
    gpu: Annotated[str, typer.Option("--gpu", help=f"{', '.join(GPUS)} or custom.")] = DEFAULT_GPU,
    gpus_per_node: GpusPerNodeOpt = GPUS_PER_NODE,
    nodes: Annotated[int, typer.Option("--nodes", min=1)] = 1,
    intra: Annotated[str, typer.Option("--intra", help="nvlink or pcie (in a node).")] = "nvlink",
    inter: Annotated[str, typer.Option("--inter", help="|".join(INTERCONNECTS))] = "infiniband",
    gpu_mem: GpuMemOpt = None,
    gpu_bandwidth: Annotated[str | None, typer.Option("--gpu-bandwidth", help="3.35TB/s.")] = None,
    bf16_tflops: Annotated[str | None, typer.Option("--gpu-bf16-tflops", help="Dense.")] = None,
    fp8_tflops: Annotated[str | None, typer.Option("--gpu-fp8-tflops", help="Dense.")] = None,
    nvlink_domain: Annotated[int | None, typer.Option("--nvlink-domain", min=1)] = None,
    dtype: DtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    context: ContextOpt = CONTEXT,
    concurrency: ConcurrencyOpt = CONCURRENCY,
    utilization: UtilizationOpt = UTILIZATION,
    utilization_alias: UtilizationAliasOpt = None,
    overhead: OverheadOpt = OVERHEAD,
    training: Annotated[bool, typer.Option("--training", help="Add Adam training state.")] = False,
    no_ep: Annotated[bool, typer.Option("--no-expert-parallel", help="Never use EP.")] = False,
    goal: Annotated[str, typer.Option(
        "--goal", help="Choose the layout for: throughput, latency or cost.")] = "throughput",
    estimate: Annotated[bool, typer.Option("--estimate", help="Params from config.")] = False,
    lock: Annotated[Path | None, typer.Option("--lock", help="TARGET is pinned here.")] = None,
    source: Annotated[Path | None, typer.Option("--from", help="With --lock: dir/cache.")] = None,
    revision: Annotated[str, typer.Option("--revision", help="For a hub REPO_ID.")] = "main",
    helm: Annotated[bool, typer.Option("--helm-values", help="Print chart values (YAML).")] = False,
    name: Annotated[str | None, typer.Option("--name", help="vllm.models[].name.")] = None,
    served: Annotated[str | None, typer.Option("--served-model-name", help="Repo id.")] = None,
    commit: Annotated[str | None, typer.Option("--commit", help="Pinned 40-hex commit.")] = None,
    store_claim: Annotated[str, typer.Option("--store-claim", help="PVC.")] = "models-store",
    endpoint: EndpointOpt = "https://huggingface.co",
    token: TokenOpt = None,
    redirect_host: RedirectHostOpt = None,
    offline: OfflineOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Plan memory, TP/PP/EP/DP layout, speed and vLLM args; exit 1 if it does not fit."""
    util = aliased(ctx, "utilization", utilization, utilization_alias,
                   "--gpu-memory-utilization", "--utilization")
    if source is not None and lock is None:
        raise SizingError("--from reads a pinned model: it needs --lock (TARGET is the repo id)")
    if intra not in ("nvlink", "pcie"):
        raise SizingError(f"--intra {intra!r}: nvlink or pcie")
    if gpu.lower() == "custom":
        if gpu_mem is None or gpu_bandwidth is None or bf16_tflops is None:
            raise SizingError("--gpu custom needs --gpu-mem, --gpu-bandwidth and "
                              "--gpu-bf16-tflops")
        spec = custom_gpu(memory_bytes=parse_memory(gpu_mem),
                          bandwidth_bytes_s=_bandwidth(gpu_bandwidth) or 0.0,
                          bf16_flops=_tflops(bf16_tflops, "--gpu-bf16-tflops") or 0.0,
                          fp8_flops=_tflops(fp8_tflops, "--gpu-fp8-tflops"),
                          nvlink_domain=nvlink_domain or 1)
    else:
        spec = with_overrides(
            gpu_spec(gpu), memory_bytes=parse_memory(gpu_mem) if gpu_mem else None,
            bandwidth_bytes_s=_bandwidth(gpu_bandwidth),
            bf16_flops=_tflops(bf16_tflops, "--gpu-bf16-tflops"),
            fp8_flops=_tflops(fp8_tflops, "--gpu-fp8-tflops"), nvlink_domain=nvlink_domain)
    config, params, repo_id, pinned = _model_inputs(target, lock, source, revision, endpoint,
                                                    token, redirect_host, offline)
    stored_fp8 = bool(params and any(k.startswith("F8") for k in params.by_dtype))
    if estimate:
        params = None
    work = Workload(dtype=dtype, kv_dtype=kv_dtype, context=context, concurrency=concurrency,
                    utilization=util,
                    overhead_bytes=parse_memory(overhead),
                    training=training, expert_parallel=not no_ep, goal=goal)
    cluster = Cluster(spec, gpus_per_node, nodes, intra, inter)
    result = make_plan(config, params, cluster, work)
    lay = result.layout
    if helm:
        if lay is None:
            diagnostics_console().print(result.shortfall(), markup=False)
            raise VerificationFailed()
        served_name = served or repo_id
        if served_name is None:
            raise SizingError("--helm-values needs the model's repo id",
                              hint="pass --served-model-name ORG/NAME (and --commit)")
        values = helm_values(result, lay, served_model_name=served_name,
                             revision=commit or pinned or "", store_claim=store_claim,
                             name=name or chart_name(served_name), stored_fp8=stored_fp8)
        print(f"# weights plan {target}: {_layout_line(lay)} on {nodes} x {gpus_per_node} "
              f"{spec.name}\n# the egress policy needs destination vllm-"
              f"{values['vllm']['models'][0]['name']} (see docs/helm.md)")
        print(yaml.safe_dump(values, sort_keys=False), end="")
        return
    doc = _to_json(result, stored_fp8)
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        _render(result, target, doc)
    if lay is None:
        raise VerificationFailed()


def _layout_line(lay: Layout) -> str:
    return (f"TP {lay.tp} x PP {lay.pp}{' + EP' if lay.ep else ''}, {lay.replicas} "
            f"replica(s), {lay.seqs_per_replica} seqs each")


def _to_json(p: Plan, stored_fp8: bool) -> dict[str, Any]:
    lay = p.layout
    g = p.cluster.gpu
    doc: dict[str, Any] = {
        "ok": lay is not None, "fits": lay is not None,
        "gpu": {"name": g.name, "memory_bytes": g.memory_bytes,
                "bandwidth_bytes_s": g.bandwidth_bytes_s, "bf16_flops": g.bf16_flops,
                "fp8_flops": g.fp8_flops, "nvlink_domain": g.nvlink_domain,
                "source": g.source, "date": g.date},
        "cluster": {"gpus_per_node": p.cluster.gpus_per_node, "nodes": p.cluster.nodes,
                    "intra": p.cluster.intra, "inter": p.cluster.inter},
        "memory": [f.to_json() for f in p.memory],
        "layout": lay.to_json() if lay else None,
        "why": p.why,
        "alternatives": [{**a.to_json(), "decode_tokens_s_estimate": aggregate_tokens_s(p, a)}
                         for a in p.alternatives],
        "speed": [f.to_json() for f in speed(p, lay)] if lay else [],
        "vllm_args": vllm_args(p, lay, stored_fp8=stored_fp8) if lay else [],
    }
    doc["notes"] = list(p.notes)
    if lay is None:
        doc["shortfall"] = p.shortfall()
        doc["closest"] = p.closest.to_json() if p.closest else None
        doc["fits_on_nodes"] = p.fits_on_nodes
    return doc


def _value(v: float, unit: str) -> str:
    if unit == "bytes" and v < 0:
        return "-" + _human(-v, unit)
    if unit in ("bytes", "params", "tokens"):
        return _human(v, unit)
    if unit == "FLOP/s":
        return f"{v / 1e12:,.1f} TFLOP/s"
    if unit == "bytes/s":
        return f"{v / 1e12:,.2f} TB/s"
    if unit == "seconds":
        return f"{v * 1000:,.1f} ms" if v < 1 else f"{v:,.2f} s"
    if float(v).is_integer():
        return f"{v:,.0f} {unit}"
    return f"{v:,.1f} {unit}"


def _render(p: Plan, target: str, doc: dict[str, Any]) -> None:
    out = _console()
    # Value and formula share a column: three columns left the formula 23 cells, too few for
    # its words (config.json:num_hidden_layers was split mid-word at 80 columns).
    mem = _table("figure", "value / source or formula", title=f"Memory: {target}")
    for f in p.memory:
        mem.add_row(f.name, f"{_value(f.value, f.unit)}\n{f.source}")
    out.print(mem)
    for n in p.notes:
        out.print(f"note: {n}", markup=False)
    lay = p.layout
    if lay is None:
        out.print(p.shortfall(), markup=False)
        return
    out.print(f"Layout: {_layout_line(lay)}", markup=False)
    print_wrapped(out, f"why: {p.why}", indent=2)
    for r in lay.reasons:
        print_wrapped(out, r, indent=2)
    if p.alternatives:
        alt = _table("rank", "TP", "PP", "EP", "replicas", "seqs each", "left per GPU",
                    "decode tok/s (est.)", title="Alternatives that also fit")
        for i, a in enumerate(p.alternatives, 2):
            alt.add_row(str(i), str(a.tp), str(a.pp), "on" if a.ep else "off",
                        str(a.replicas), str(a.seqs_per_replica),
                        _human(a.left_per_gpu, "bytes"), f"{aggregate_tokens_s(p, a):,.0f}")
        out.print(alt)
    sp = _table("figure", "value / formula", title="Speed (estimates, roofline arithmetic)")
    for f in speed(p, lay):
        sp.add_row(f.name, f"{_value(f.value, f.unit)}\n{f.source}")
    out.print(sp)
    out.print("What to run: vllm serve MODEL " + " ".join(doc["vllm_args"]), markup=False)
