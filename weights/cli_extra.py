"""``weights keygen``, ``sign`` and ``size`` (registered on the app by :mod:`weights.cli`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from clishell.consoles import table as _table
from weights.cli_common import (
    EndpointOpt,
    JsonOpt,
    OfflineOpt,
    QuietOpt,
    RedirectHostOpt,
    TokenOpt,
    VerificationFailed,
    hub_client,
    progress,
)
from weights.cli_common import console as _console
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
    KvDtypeOpt,
    OverheadOpt,
    UtilizationAliasOpt,
    UtilizationOpt,
    aliased,
)
from weights.errors import OutputExistsError, SizingError, TargetNotFoundError, WeightsError
from weights.memory import parse_memory, size_model
from weights.sizing import (
    ParamCount,
    count_params,
    local_safetensors,
    parse_header,
    read_header_file,
)


def keygen(
    out: Annotated[Path, typer.Option("--out", help="Private key file to create (KEY.pem).")],
) -> None:
    """Create an EC P-256 model-signing key (KEY.pem, mode 0600) and KEY.pub."""
    from weights.signing import generate_key

    pub = generate_key(out)
    _console().print(f"private key {out}\npublic key  {pub}\n(for `weights sign --key` and "
                     "`weights verify --public-key`; bundles use `airgap keygen`)")


def sign(
    path: Annotated[Path, typer.Argument(help="Model directory to sign.")],
    key: Annotated[Path, typer.Option(
        "--key", help="EC P-256/P-384/P-521 private key (PEM), e.g. from `weights keygen`; "
        "not the Ed25519 key of `airgap keygen`.")],
    out: Annotated[Path, typer.Option("--out", help="Signature file.")] = Path("model.sig"),
    password: Annotated[
        str | None, typer.Option("--password", envvar="WEIGHTS_KEY_PASSWORD", help="Key password.")
    ] = None,
    ignore: Annotated[list[str] | None, typer.Option("--ignore", help="Glob to leave out.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace an existing signature file.")] = False,
    quiet: QuietOpt = False,
) -> None:
    """Sign PATH in the OpenSSF model-signing format (verifiable by `model_signing verify key`)."""
    from weights.signing import sign_model

    if not path.is_dir():
        raise WeightsError(f"{path} is not a directory")
    if out.exists() and not force:  # a signature someone may still rely on
        raise OutputExistsError(f"{out} exists: not replacing a signature",
                                hint="pass --force to replace it, or --out another file")
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    with progress(total, f"sign {path.name}", quiet) as adv:
        signed = sign_model(path, key, out, password=password, ignore=ignore or (), progress=adv)
    if not quiet:
        _console().print(f"signed {len(signed)} files of {path} -> {out}")
        left = left_out(path, signed)
        if left:
            shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
            _console().print(f"left out {len(left)}: {shown} (git metadata, as OpenSSF model "
                             "signing leaves it out, and --ignore globs)", markup=False)


def left_out(path: Path, signed: Iterable[str]) -> list[str]:
    """The files under ``path`` (``.git/`` aside) that a signature over ``signed`` does not
    cover, sorted relative POSIX paths: ``weights sign`` names them, so that a file left out
    (``.gitattributes``, an ``--ignore`` glob) is never a surprise at ``weights verify``."""
    from weights.verify import list_files

    covered = set(signed)
    return [rel for rel in list_files(path, skip_dirs=(".git",)) if rel not in covered]


def is_repo_id(target: str) -> bool:
    """Whether a TARGET that is not on disk names a hub repo (``ORG/NAME``), not a local path.

    A missing ``model/config.json`` (a file name) or ``model/sub`` whose ``model`` directory
    exists is a local path the operator has not created yet: it is reported as missing, not
    looked up on the hub (which, offline, said "cannot reach the hub" about a file name).
    """
    if target.startswith((".", "/", "~")) or target.count("/") != 1:
        return False
    org, name = target.split("/")
    return bool(org and name) and not name.endswith(".json") and not Path(org).is_dir()


def missing_target(target: str) -> TargetNotFoundError:
    """The error for a TARGET that is neither on disk nor a hub repo id."""
    return TargetNotFoundError(f"{target}: no such file or directory",
                        hint="give the model's directory or its config.json (copy the files "
                             "there first), or a hub ORG/NAME")


def _local_inputs(path: Path) -> tuple[dict[str, Any], ParamCount | None]:
    cfg_path = path if path.is_file() else path / "config.json"
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SizingError(f"{cfg_path}: cannot read config.json: {exc}") from exc
    if path.is_file():
        return config, None
    files = local_safetensors(path)
    if not files:
        return config, None
    return config, count_params((f.name, read_header_file(f)) for f in files)


def _remote_inputs(
    hub: Any, repo_id: str, revision: str
) -> tuple[dict[str, Any], ParamCount | None]:
    snap = hub.snapshot(repo_id, revision)
    by_path = {f.path: f for f in snap.files}
    if "config.json" not in by_path:
        raise SizingError(f"{repo_id}@{revision}: no config.json")
    raw = hub.read_range(snap.repo_id, snap.commit, "config.json", 0, by_path["config.json"].size)
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise SizingError(f"{repo_id}: config.json is not JSON: {exc}") from exc
    shards = sorted(p for p in by_path if p.endswith(".safetensors") and "/" not in p)
    if not shards:
        return config, None
    headers = []
    for name in shards:
        prefix = hub.read_range(snap.repo_id, snap.commit, name, 0, 8)
        if len(prefix) != 8:
            raise SizingError(f"{name}: shorter than 8 bytes")
        header = parse_header(prefix, partial(hub.read_range, snap.repo_id, snap.commit,
                                              name, 8), by_path[name].size)
        headers.append((name, header))
    return config, count_params(headers)


def _human(value: float, unit: str) -> str:
    if unit == "bytes":
        gib = value / 1024**3
        if value >= 1024**3:
            return f"{value / 1e9:,.1f} GB ({gib:,.1f} GiB)"
        if value >= 1024**2:
            return f"{value / 1024**2:,.1f} MiB"
        return f"{value / 1024:,.1f} KiB" if value >= 1024 else f"{value:,.0f} B"
    if unit == "params":
        return f"{value:,.0f} ({value / 1e9:,.2f} B)"
    if unit == "tokens":
        return f"{value:,.0f} tokens"
    return f"{value:g}"


def size(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="Local dir / config.json, or a REPO_ID.")],
    dtype: DtypeOpt = None,
    kv_dtype: KvDtypeOpt = None,
    context: ContextOpt = CONTEXT,
    concurrency: ConcurrencyOpt = CONCURRENCY,
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help=f"GPU type, as weights plan (with --gpu-mem alone: {DEFAULT_GPU}).")
    ] = None,
    gpu_mem: GpuMemOpt = None,
    gpus_per_node: Annotated[int, typer.Option(
        "--gpus-per-node", min=1, help="GPUs of the one replica (its tensor-parallel degree).")
    ] = GPUS_PER_NODE,
    gpus_alias: Annotated[int | None, typer.Option("--gpus", min=1, hidden=True)] = None,
    utilization: UtilizationOpt = UTILIZATION,
    utilization_alias: UtilizationAliasOpt = None,
    overhead: OverheadOpt = OVERHEAD,
    estimate: Annotated[
        bool, typer.Option("--estimate", help="Count parameters from config, not headers.")
    ] = False,
    revision: Annotated[str, typer.Option("--revision", help="For REPO_ID.")] = "main",
    endpoint: EndpointOpt = "https://huggingface.co",
    token: TokenOpt = None,
    redirect_host: RedirectHostOpt = None,
    offline: OfflineOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Weights, KV cache and, with --gpu or --gpu-mem, the fit of one replica on
    --gpus-per-node GPUs; exit 1 if it does not fit. Same workload flags, defaults and
    figures as weights plan."""
    from weights.gpus import gpu_spec, with_overrides
    from weights.memory import SizingReport
    from weights.plan import (
        gpu_figures,
        kv_total_figure,
        replica_layout,
        tensor_parallel_ok,
    )
    from weights.plan_model import model_facts
    from weights.plan_types import Cluster, Workload

    # The flags first: a bad size is a usage error before any model is read.
    util = aliased(ctx, "utilization", utilization, utilization_alias,
                   "--gpu-memory-utilization", "--utilization")
    tp = aliased(ctx, "gpus_per_node", gpus_per_node, gpus_alias, "--gpus-per-node", "--gpus")
    memory = parse_memory(gpu_mem) if gpu_mem else None
    spec = (with_overrides(gpu_spec(gpu or DEFAULT_GPU), memory_bytes=memory)
            if gpu is not None or memory is not None else None)
    work = Workload(dtype=dtype, kv_dtype=kv_dtype, context=context, concurrency=concurrency,
                    utilization=util,
                    overhead_bytes=parse_memory(overhead))
    path = Path(target)
    if path.exists():
        config, params = _local_inputs(path)
    elif is_repo_id(target):
        hub = hub_client(endpoint, token, redirect_host, offline)
        config, params = _remote_inputs(hub, target, revision)
    else:
        raise missing_target(target)
    if estimate:
        params = None
    model = size_model(config, params, dtype=dtype, kv_dtype=kv_dtype, context=context,
                       concurrency=concurrency)
    facts = model_facts(config, params, work)
    # The KV cache of the workload as the plan computes it (sliding-window layers included).
    figures = [f for f in model.figures if f.name != "kv cache"]
    figures += [f for f in facts.figures
                if f.name in ("sliding-window layers", "kv cache per sequence")]
    figures.append(kv_total_figure(facts, work))
    fits: bool | None = None
    min_gpus: int | None = None
    why_not: str | None = None
    if spec is not None:
        lay = replica_layout(facts, spec, work, tp)
        figures += gpu_figures(facts, Cluster(spec, tp, 1), work, lay)
        fits = lay.fits and tensor_parallel_ok(facts, tp)
        # Say which of the two failed: the table shows memory left over when only the
        # degree is refused, and "does NOT fit" alone then reads as a contradiction.
        if not tensor_parallel_ok(facts, tp):
            why_not = (f"vLLM refuses tensor-parallel degree {tp}: it does not divide the "
                       f"{facts.heads} attention heads, or the {facts.kv_heads} KV heads "
                       "(nor is a multiple of them)")
        elif not lay.fits:
            why_not = ("weights, KV cache and engine overhead exceed the usable memory per "
                       "GPU (see 'left per gpu')")
        min_gpus = next((t for t in (2**i for i in range(11)) if tensor_parallel_ok(facts, t)
                         and replica_layout(facts, spec, work, t).fits), None)
    report = SizingReport(figures=tuple(figures), fits=fits, min_gpus=min_gpus,
                          weights_dtype=model.weights_dtype, kv_dtype=model.kv_dtype,
                          why_not=why_not)
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        table = _table("figure", "value", "source", title=f"size {target}")
        for f in report.figures:
            table.add_row(f.name, _human(f.value, f.unit) if f.value >= 0
                          else "-" + _human(-f.value, f.unit), f.source)
        console = _console()
        console.print(table)
        for label, dt in (("weights dtype", report.weights_dtype),
                          ("kv cache dtype", report.kv_dtype)):
            if dt is not None:
                console.print(f"{label}: {dt.name} ({dt.source})")
        if report.fits is not None:
            verdict = "fits" if report.fits else "does NOT fit"
            why = f" ({report.why_not})" if report.why_not else ""
            console.print(escape(f"{verdict} on {tp} GPU(s) as one replica{why}; smallest "
                                 "tensor-parallel degree that fits: "
                                 f"{report.min_gpus or 'none up to 1024'}"))
    if report.fits is False:
        raise VerificationFailed()
