"""The typer application of ``airgap`` (``airgap.cli.app``): every command's options and help.

:func:`airgap.cli.main` runs it, except for a plain ``airgap verify`` command line, which
:mod:`airgap.cli` parses and runs without importing typer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from airgap.bundle import DEFAULT_PART_SIZE, INDEX_NAME, MAX_INDEX_BYTES, SIGNATURE_NAME
from airgap.cli_verify import (
    _load_lock,
    _peek_payload,
    _print_problems,
    _progress,
    _shows_progress,
    _trusted_keys,
    _workers,
    err,
    out,
    run_verify,
)
from airgap.errors import AirgapError, Code, VerificationFailed
from airgap.media import check_bundle_dir, read_small
from airgap.signing import MAX_SIGNATURE_BYTES, signer_key_id
from airgap.target import MAX_LISTED
from airgap.validate import parse_index
from clishell import VerboseOpt, VersionOpt
from clishell.consoles import print_wrapped, table
from clishell.text import escaped, human_bytes, shown
from weights import Lockfile, SerialisationPolicy, WeightsError

if TYPE_CHECKING:
    from airgap.unpack import Layout

__all__ = ["app"]

app = typer.Typer(
    name="airgap",
    help="Carry pinned, verified model weights across an air gap as a signed bundle.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


AllowPickle = Annotated[bool, typer.Option(
    "--allow-pickle", help="Accept pickle-based files scanned safe by the allowlist scanner.")]
AllowCode = Annotated[bool, typer.Option(
    "--allow-remote-code", help="Accept Python files and auto_map configs (trust_remote_code).")]
PublicKeys = Annotated[
    list[Path],
    typer.Option("--public-key", "-k", help="Trusted Ed25519 public key (PEM); repeatable."),
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
Workers = Annotated[
    int, typer.Option("--workers", min=0, help="Hashing threads (0 = one per core).")
]
ExpectedLock = Annotated[
    Path | None,
    typer.Option("--lock", help="Also require the bundle's pins to equal this lockfile."),
]


@app.command()
def keygen(
    out_path: Annotated[Path, typer.Option("--out", help="Private key file (KEY.pem).")],
) -> None:
    """Create an Ed25519 signing key (KEY.pem, mode 0600) and its public key (KEY.pub)."""
    from airgap.signing import generate_keypair

    pub, kid = generate_keypair(out_path)
    out().print(f"private key {out_path}\npublic key  {pub}\nkey id      {kid}")


@app.command()
def pack(
    lock: Annotated[Path, typer.Option("--lock", help="weights.lock with the pins.")],
    source: Annotated[Path, typer.Option("--from", help="Model dir, snapshot or HF cache.")],
    bundle: Annotated[Path, typer.Option("--out", help="Bundle directory to create.")],
    key: Annotated[Path, typer.Option("--key", help="Ed25519 private key (PEM).")],
    include: Annotated[
        list[Path], typer.Option("--include-file", help="Extra file to carry; repeatable.")
    ] = [],  # noqa: B006 - typer needs a literal default
    part_size: Annotated[
        int, typer.Option("--part-size", min=1, max=2**63 - 1,
                          help="Max bytes per part (FAT32: 4 GiB - 1)."),
    ] = DEFAULT_PART_SIZE,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing bundle.")] = False,
    repos: Annotated[
        list[str], typer.Option("--repo", help="Pack only this repo id of the lock; repeatable.")
    ] = [],  # noqa: B006 - typer needs a literal default
    compress: Annotated[
        bool, typer.Option("--compress", help="zlib-encode blobs that shrink (off: weights "
                           "do not compress).")
    ] = False,
    quiet: Quiet = False,
    allow_pickle: AllowPickle = False,
    allow_remote_code: AllowCode = False,
    since: Annotated[
        Path | None, typer.Option("--since", help="Base bundle's index.json: pack a delta.")
    ] = None,
) -> None:
    """Verify the source against the lock while copying it into a new signed bundle."""
    from airgap.pack import pack_bundle
    from airgap.signing import load_private_key

    locked = _load_lock(lock)
    assert locked is not None
    if repos:
        try:
            locked = Lockfile(entries=tuple(locked.entry(r) for r in repos))
        except WeightsError as exc:
            raise AirgapError(Code.LOCK_INVALID, str(exc)) from exc
    signing_key = load_private_key(key)
    total = sum(e.total_bytes for e in locked.entries)
    with _progress(total, "packing", quiet) as progress:
        report = pack_bundle(locked, source, bundle, signing_key, include_files=include,
                             part_size=part_size, force=force, compress=compress,
                             progress=progress,
                             policy=SerialisationPolicy(allow_pickle=allow_pickle,
                                          allow_remote_code=allow_remote_code),
                             since=since)  # fmt: skip
    for leftover in report.leftovers_removed:
        err().print(f"removed {leftover}, left by an interrupted earlier pack", markup=False)
    idx = report.index
    rate = idx.payload_size / max(report.seconds, 1e-9) / 1024**3
    out().print(
        f"packed {len(idx.files)} files ({idx.payload_size} bytes) into {len(idx.parts)} parts "
        f"at {bundle} in {report.seconds:.1f} s ({rate:.2f} GiB/s); signed by {report.signer[:16]}"
    )


@app.command()
def verify(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory.")],
    public_key: PublicKeys,
    expected_lock: ExpectedLock = None,
    all_parts: Annotated[
        bool, typer.Option("--all-parts", help="Also hash every part whole (slower).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
    workers: Workers = 0,
    quiet: Quiet = False,
) -> None:
    """Verify a bundle offline: signature, parts, content digests and pins (every problem)."""
    rc = run_verify(bundle, public_key, expected_lock, all_parts, as_json, workers, quiet)
    if rc:
        raise typer.Exit(rc)


@app.command()
def unpack(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory.")],
    public_key: PublicKeys,
    store: Annotated[Path, typer.Option("--into", help="HF cache root or target directory.")],
    layout: Annotated[
        str, typer.Option("--layout", help="hf-cache (default) or dir.")
    ] = "hf-cache",
    extras_into: Annotated[
        Path | None, typer.Option("--extras-into", help="Where to put the extra files.")
    ] = None,
    expected_lock: ExpectedLock = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable summary.")] = False,
    workers: Workers = 0,
    quiet: Quiet = False,
    allow_pickle: AllowPickle = False,
    allow_remote_code: AllowCode = False,
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace a model directory (or snapshot) that "
                           "holds files the bundle does not carry, removing them.")
    ] = False,
) -> None:
    """Verify, then install atomically into a Hugging Face cache or a plain directory."""
    from airgap.unpack import unpack_bundle

    if layout not in ("hf-cache", "dir"):
        raise AirgapError(Code.IO_ERROR, f"--layout must be hf-cache or dir, not {layout!r}")
    keys = _trusted_keys(public_key)
    check_bundle_dir(bundle)
    chosen: Layout = "hf-cache" if layout == "hf-cache" else "dir"
    total = _peek_payload(bundle) if _shows_progress(quiet or as_json) else 0
    with _progress(total, "installing", quiet or as_json) as progress:
        report = unpack_bundle(bundle, keys, store, layout=chosen, extras_into=extras_into,
                               expected_lock=_load_lock(expected_lock),
                               workers=_workers(workers), progress=progress,
                               policy=SerialisationPolicy(allow_pickle=allow_pickle,
                                          allow_remote_code=allow_remote_code),
                               replace=replace)  # fmt: skip
    if as_json:
        out().print_json(json.dumps({
            "ok": True, "store": str(store), "layout": report.layout,
            "signer_key_id": report.check.signer,
            "locations": {k: str(v) for k, v in report.locations.items()},
            "written": report.written, "skipped": report.skipped, "repaired": report.repaired,
            "bytes_written": report.bytes_written, "seconds": round(report.seconds, 3),
            "refs_moved": {k: {"old": a, "new": b} for k, (a, b) in report.refs_moved.items()},
            "resumed": report.resumed,
            "leftovers_removed": [str(p) for p in report.leftovers_removed],
            "replaced": report.replaced,
        }))  # fmt: skip
        return
    for leftover in report.leftovers_removed:
        err().print(f"resumed from {leftover}, left by an interrupted earlier unpack "
                  f"({report.resumed} blob(s) reused in all), then removed it", markup=False)
    for repo_id, removed in report.replaced.items():
        names = ", ".join(shown(n) for n in removed[:MAX_LISTED])
        more = f" and {len(removed) - MAX_LISTED} more" if len(removed) > MAX_LISTED else ""
        err().print(f"replaced {shown(report.locations[repo_id])} whole (--replace), removing "
                    f"{len(removed)} entr{'y' if len(removed) == 1 else 'ies'} the bundle does "
                    f"not carry or carries otherwise: {names}{more}", markup=False,
                    highlight=False)
    for repo_id, where in report.locations.items():
        out().print(f"{repo_id} -> {shown(where)}", markup=False, highlight=False)
    for label, (old, new) in report.refs_moved.items():
        repo_id, _, revision = label.rpartition("@")
        out().print(f"{repo_id}: refs/{revision} moved {old[:12]} -> {new[:12]} "
                    "(old snapshot kept)")
    out().print(f"written {report.written}, already present {report.skipped}, repaired "
              f"{report.repaired}; {report.bytes_written} bytes in {report.seconds:.1f} s")


@app.command()
def inspect(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the index as JSON.")] = False,
) -> None:
    """Show what a bundle holds (the index is NOT verified: use `airgap verify`)."""
    from airgap.mlbom import BOM_NAME, read_extra, summary

    check_bundle_dir(bundle)
    data = read_small(bundle, INDEX_NAME, MAX_INDEX_BYTES, Code.INDEX_MISSING)
    index = parse_index(data)
    try:
        signer = signer_key_id(read_small(bundle, SIGNATURE_NAME, MAX_SIGNATURE_BYTES,
                                          Code.SIGNATURE_MISSING))  # fmt: skip
    except VerificationFailed as exc:
        signer = f"({exc.code})"
    if as_json:
        doc = index.to_json() | {"signer_key_id_claimed": signer}
        out().print_json(json.dumps(doc))
        return
    # Sentences wrapped at word boundaries to the width (80 when piped); only the file list
    # below stays one tab-separated line per file when piped, for grep, cut and diff.
    print_wrapped(out(), f"bundle {bundle}: {index.tool}, created {index.created_at}")
    print_wrapped(out(), f"signer key id (claimed, unverified): {signer}")
    bom = read_extra(bundle, index, BOM_NAME)
    for line in summary(bom) if bom is not None else ["ML-BOM: none in this bundle"]:
        indent = len(line) - len(line.lstrip(" "))
        # the ML-BOM's values are not checked by inspect (verify compares them to the index)
        print_wrapped(out(), escaped(line.lstrip(" ")), indent=indent)
    if index.base is not None:
        print_wrapped(out(), f"delta bundle: {len(index.base.blobs)} blob(s) "
                             f"({sum(b.size for b in index.base.blobs)} bytes) expected in the "
                             f"store from base index sha256 {index.base.index_sha256}")
    for e in index.lock.entries:
        pin = f"commit {e.commit}" if e.origin is None else (
            f"content id {e.commit} (locked from local files, not a hub commit"
            + (f"; upstream claimed {e.origin.claimed_repo_id or '?'}@"
               f"{e.origin.claimed_commit or '?'}, not verified)"
               if e.origin.claimed_repo_id or e.origin.claimed_commit else ")"))
        print_wrapped(out(), f"model {e.repo_id} revision {e.requested_revision} {pin}")
        print_wrapped(out(), f"licence {e.license or 'unknown'}, gated "
                             f"{'yes' if e.gated else 'no'}, {len(e.files)} files, "
                             f"{human_bytes(e.total_bytes)}, pinned {e.pinned_at}", indent=2)
    if out().is_terminal:
        files = table("file", "size", "sha256", "blob id")
        for f in index.files:
            files.add_row(f.label, str(f.size), f.sha256[:16], f.blob_id[:16])
        out().print(files)
    else:  # piped: one tab-separated line per file, full digests (for grep, cut, diff)
        for f in index.files:
            sys.stdout.write(f"{f.label}\t{f.size}\t{f.sha256}\t{f.blob_id}\n")
    parts = table("part", "offset", "size", "sha256")
    for p in index.parts:
        parts.add_row(p.name, str(p.offset), str(p.size), p.sha256[:16])
    out().print(parts)
    parts_n = len(index.parts)
    print_wrapped(out(), f"payload {human_bytes(index.payload_size)} in {parts_n} "
                         f"part{'s' if parts_n != 1 else ''}, {len(index.blobs)} distinct "
                         f"blob{'s' if len(index.blobs) != 1 else ''}; each part at most "
                         f"{human_bytes(index.part_size)}, the --part-size it was packed with")


@app.command("oci-export")
def oci_export(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory.")],
    public_key: PublicKeys,
    out_dir: Annotated[Path, typer.Option("--out", help="OCI image layout to create.")],
    repo: Annotated[str | None, typer.Option("--repo", help="Model of the bundle.")] = None,
    tag: Annotated[str | None, typer.Option("--tag", help="Reference name.")] = None,
    allow_pickle: AllowPickle = False,
    allow_remote_code: AllowCode = False,
) -> None:
    """Verify a bundle and write one model as an OCI artifact (CNCF ModelPack media types)."""
    from airgap.oci import export_oci

    keys = _trusted_keys(public_key)
    export_oci(bundle, keys, out_dir, repo_id=repo, tag=tag,
               policy=SerialisationPolicy(allow_pickle=allow_pickle,
                                          allow_remote_code=allow_remote_code))
    # The command to copy-paste names the reference written (the commit's first 12 hex unless
    # --tag) and the model (registries take lower-case names); only REGISTRY is the operator's.
    manifest = json.loads((out_dir / "index.json").read_text(encoding="utf-8"))["manifests"][0]
    ref = manifest["annotations"]["org.opencontainers.image.ref.name"]
    config = json.loads((out_dir / "blobs" / "sha256" / manifest["digest"].split(":", 1)[1])
                        .read_text(encoding="utf-8"))["config"]
    config = json.loads((out_dir / "blobs" / "sha256" / config["digest"].split(":", 1)[1])
                        .read_text(encoding="utf-8"))
    name = str(config["descriptor"]["name"]).lower()
    out().print(f"wrote OCI layout {out_dir} (tag {ref}); push with: skopeo copy "
              f"oci:{out_dir}:{ref} docker://REGISTRY/{name}:{ref}", highlight=False,
              soft_wrap=True)


@app.command("oci-verify")
def oci_verify(
    layout: Annotated[Path, typer.Argument(help="OCI image layout directory.")],
    public_key: PublicKeys,
    tag: Annotated[str | None, typer.Option("--tag", help="Reference name.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable report.")] = False,
) -> None:
    """Verify an OCI model artifact offline: signed index, pinned layer digests, blob bytes."""
    from airgap.oci import verify_oci

    keys = _trusted_keys(public_key)
    report = verify_oci(layout, keys, tag=tag)
    if as_json:
        out().print_json(json.dumps({"ok": report.ok, "repo_id": report.repo_id,
                                   "commit": report.commit, "signer_key_id": report.signer,
                                   "layers": report.layers,
                                   "problems": [p.to_json() for p in report.problems]}))
    elif report.ok:
        out().print(f"OK {layout}: {report.repo_id}@{report.commit}, {len(report.layers)} "
                  f"layers match the pins, signed by {report.signer}")
    else:
        _print_problems(report.problems, "FAIL ")
    if not report.ok:
        raise typer.Exit(1)


@app.callback()
def _root(version: VersionOpt = False, verbose: VerboseOpt = False) -> None:
    """Air-gap bundles for sovereign-gateway."""
