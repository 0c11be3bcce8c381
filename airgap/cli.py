"""``airgap`` command line: keygen, pack, verify, unpack, inspect.

Each command parses, calls the public API and renders. ``main()`` is the one error boundary:
exit 0 ok, 1 verification failed (bundle, signature or content not trusted), 2 usage or I/O.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from airgap import __version__
from airgap.bundle import DEFAULT_PART_SIZE, INDEX_NAME, MAX_INDEX_BYTES, SIGNATURE_NAME, Index
from airgap.errors import AirgapError, Code, Problem, VerificationFailed
from airgap.interrupt import Interrupted, die_by, interruptible
from airgap.media import check_bundle_dir, read_small
from airgap.pack import pack_bundle
from airgap.signing import (
    MAX_SIGNATURE_BYTES,
    generate_keypair,
    load_private_key,
    load_public_key,
    signer_key_id,
)
from airgap.stream import default_workers
from airgap.unpack import Layout, unpack_bundle
from airgap.verify import MAX_SHOWN_PROBLEMS, problems_json, verify_bundle
from weights import EmptyModelError, Lockfile, PathCollisionError, WeightsError

app = typer.Typer(
    name="airgap",
    help="Carry pinned, verified model weights across an air gap as a signed bundle.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# markup off: file names, paths and revisions such as "a[/b]" are printed as they are.
err = Console(stderr=True, soft_wrap=True, markup=False)
out = Console(soft_wrap=True, markup=False)

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


@contextlib.contextmanager
def _progress(total: int, label: str, quiet: bool) -> Iterator[Any]:
    """Yield a byte-count callback drawing a rich progress bar (none if quiet or not a TTY)."""
    if quiet or not err.is_terminal:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def _load_lock(path: Path | None) -> Lockfile | None:
    if path is None:
        return None
    try:
        return Lockfile.load(path)
    except PathCollisionError as exc:
        raise AirgapError(Code.PATH_COLLISION, exc.message) from exc
    except EmptyModelError as exc:
        raise AirgapError(Code.EMPTY_MODEL, exc.message) from exc
    except WeightsError as exc:
        raise AirgapError(Code.LOCK_INVALID, str(exc)) from exc


def _workers(n: int) -> int:
    return n or default_workers()


def _peek_payload(bundle: Path) -> int:
    """Payload size from an (unverified) index, for the progress bar only.

    A scan for the one field, not a JSON parse: the index is not trusted yet, and parsing a
    hostile 40 MB index would cost more than refusing it does (docs/airgap.md)."""
    try:
        data = read_small(bundle, INDEX_NAME, MAX_INDEX_BYTES, Code.INDEX_MISSING)
    except VerificationFailed:
        return 0
    found = re.search(rb'"payload_size"\s*:\s*(\d{1,19})', data)
    return int(found.group(1)) if found else 0


def _shows_progress(quiet: bool) -> bool:
    return not quiet and err.is_terminal


@app.command()
def keygen(
    out_path: Annotated[Path, typer.Option("--out", help="Private key file (KEY.pem).")],
) -> None:
    """Create an Ed25519 signing key (KEY.pem, mode 0600) and its public key (KEY.pub.pem)."""
    pub, kid = generate_keypair(out_path)
    out.print(f"private key {out_path}\npublic key  {pub}\nkey id      {kid}")


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
) -> None:
    """Verify the source against the lock while copying it into a new signed bundle."""
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
                             progress=progress)  # fmt: skip
    for leftover in report.leftovers_removed:
        err.print(f"removed {leftover}, left by an interrupted earlier pack", markup=False)
    idx = report.index
    rate = idx.payload_size / max(report.seconds, 1e-9) / 1024**3
    out.print(
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
    keys = [load_public_key(p) for p in public_key]
    check_bundle_dir(bundle)
    total = _peek_payload(bundle) if _shows_progress(quiet or as_json) else 0
    with _progress(total, "verifying", quiet or as_json) as progress:
        report = verify_bundle(bundle, keys, expected_lock=_load_lock(expected_lock),
                               workers=_workers(workers), all_parts=all_parts,
                               progress=progress)  # fmt: skip
    if as_json:
        out.print_json(json.dumps(report.to_json()))
    elif report.ok:
        rate = report.bytes_hashed / max(report.seconds, 1e-9) / 1024**3
        out.print(f"OK {bundle}: signed by {report.signer}, {report.bytes_hashed} bytes "
                  f"verified in {report.seconds:.1f} s ({rate:.2f} GiB/s)")  # fmt: skip
    else:
        _print_problems(report.problems, "FAIL ")
    if not report.ok:
        raise typer.Exit(1)


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
) -> None:
    """Verify, then install atomically into a Hugging Face cache or a plain directory."""
    if layout not in ("hf-cache", "dir"):
        raise AirgapError(Code.IO_ERROR, f"--layout must be hf-cache or dir, not {layout!r}")
    keys = [load_public_key(p) for p in public_key]
    check_bundle_dir(bundle)
    chosen: Layout = "hf-cache" if layout == "hf-cache" else "dir"
    total = _peek_payload(bundle) if _shows_progress(quiet or as_json) else 0
    with _progress(total, "installing", quiet or as_json) as progress:
        report = unpack_bundle(bundle, keys, store, layout=chosen, extras_into=extras_into,
                               expected_lock=_load_lock(expected_lock),
                               workers=_workers(workers), progress=progress)  # fmt: skip
    if as_json:
        out.print_json(json.dumps({
            "ok": True, "store": str(store), "layout": report.layout,
            "signer_key_id": report.check.signer,
            "locations": {k: str(v) for k, v in report.locations.items()},
            "written": report.written, "skipped": report.skipped, "repaired": report.repaired,
            "bytes_written": report.bytes_written, "seconds": round(report.seconds, 3),
            "refs_moved": {k: {"old": a, "new": b} for k, (a, b) in report.refs_moved.items()},
            "resumed": report.resumed,
            "leftovers_removed": [str(p) for p in report.leftovers_removed],
        }))  # fmt: skip
        return
    for leftover in report.leftovers_removed:
        err.print(f"resumed from {leftover}, left by an interrupted earlier unpack "
                  f"({report.resumed} blob(s) reused in all), then removed it", markup=False)
    for repo_id, where in report.locations.items():
        out.print(f"{repo_id} -> {where}")
    for label, (old, new) in report.refs_moved.items():
        repo_id, _, revision = label.rpartition("@")
        out.print(f"{repo_id}: refs/{revision} moved {old[:12]} -> {new[:12]} (old snapshot kept)")
    out.print(f"written {report.written}, already present {report.skipped}, repaired "
              f"{report.repaired}; {report.bytes_written} bytes in {report.seconds:.1f} s")


@app.command()
def inspect(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the index as JSON.")] = False,
) -> None:
    """Show what a bundle holds (the index is NOT verified: use `airgap verify`)."""
    check_bundle_dir(bundle)
    data = read_small(bundle, INDEX_NAME, MAX_INDEX_BYTES, Code.INDEX_MISSING)
    index = Index.parse(data)
    try:
        signer = signer_key_id(read_small(bundle, SIGNATURE_NAME, MAX_SIGNATURE_BYTES,
                                          Code.SIGNATURE_MISSING))  # fmt: skip
    except VerificationFailed as exc:
        signer = f"({exc.code})"
    if as_json:
        doc = index.to_json() | {"signer_key_id_claimed": signer}
        out.print_json(json.dumps(doc))
        return
    out.print(f"bundle {bundle}: {index.tool}, created {index.created_at}")
    out.print(f"signer key id (claimed, unverified): {signer}")
    for e in index.lock.entries:
        out.print(f"model {e.repo_id} revision {e.requested_revision} commit {e.commit}\n"
                  f"  licence {e.license or '-'}, gated {'yes' if e.gated else 'no'}, "
                  f"{len(e.files)} files, {e.total_bytes} bytes, pinned {e.pinned_at}",
                  highlight=False)  # fmt: skip
    if out.is_terminal:
        files = Table("file", "size", "sha256", "blob id")
        files.columns[0].overflow = "fold"  # never cut a name short
        for f in index.files:
            files.add_row(f.label, str(f.size), f.sha256[:16], f.blob_id[:16])
        out.print(files)
    else:  # piped: one tab-separated line per file, full digests (for grep, cut, diff)
        for f in index.files:
            sys.stdout.write(f"{f.label}\t{f.size}\t{f.sha256}\t{f.blob_id}\n")
    parts = Table("part", "offset", "size", "sha256")
    for p in index.parts:
        parts.add_row(p.name, str(p.offset), str(p.size), p.sha256[:16])
    out.print(parts)
    out.print(f"payload {index.payload_size} bytes in {len(index.parts)} part(s) of at most "
              f"{index.part_size} bytes; {len(index.blobs)} distinct blob(s)")  # fmt: skip


def _print_problems(problems: Sequence[Problem], prefix: str) -> None:
    """The first ``MAX_SHOWN_PROBLEMS`` problems, one line each, then how many more."""
    for p in problems[:MAX_SHOWN_PROBLEMS]:
        err.print(f"{prefix}{p.code}: {p.message}{_detail(p)}", markup=False, highlight=False)
    if len(problems) > MAX_SHOWN_PROBLEMS:
        err.print(f"{prefix}... and {len(problems) - MAX_SHOWN_PROBLEMS} more problem(s) "
                  f"({len(problems)} in all; fix these first)", markup=False, highlight=False)


def _detail(p: Problem) -> str:
    """`` (expected X, got Y)`` unless the message already says so."""
    if p.expected is None or p.expected in p.message:
        return ""
    return f" (expected {p.expected}, got {p.actual})"


def _version(value: bool) -> None:
    if value:
        out.print(f"airgap {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show version.")
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="Show tracebacks on errors (any position).")
    ] = False,
) -> None:
    """Air-gap bundles for sovereign-gateway."""


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI with one error boundary; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in args
    args = [a for a in args if a != "--verbose"]
    try:
        with interruptible():
            rc = app(args=args, prog_name="airgap", standalone_mode=False)
    except Interrupted as exc:
        if "--json" in args:
            doc = {"ok": False, "interrupted": True, "signal": exc.name, "error": {
                "code": "interrupted", "message": f"interrupted by {exc.name}"}}
            out.print_json(json.dumps(doc))
            sys.stdout.flush()
        err.print(f"error: interrupted by {exc.name}; partial output was removed",
                  markup=False, highlight=False)
        return die_by(exc.signum)
    except VerificationFailed as exc:
        if "--json" in args:
            doc = {"ok": False, **problems_json(exc.problems)}
            out.print_json(json.dumps(doc))
        _print_problems(exc.problems, "error: ")
        if verbose:
            err.print_exception()
        return 1
    except AirgapError as exc:
        if "--json" in args:  # a document for every outcome of a --json command
            doc = {"ok": False, "error": {"code": exc.code, "message": exc.message}}
            out.print_json(json.dumps(doc))
        err.print(f"error: {exc.code}: {exc.message}", markup=False, highlight=False)
        if verbose:
            err.print_exception()
        return exc.exit_code
    except OSError as exc:
        err.print(f"error: io_error: {exc}", markup=False, highlight=False)
        if verbose:
            err.print_exception()
        return 2
    except (typer.Abort, KeyboardInterrupt):
        err.print("aborted")
        return 2
    except typer.TyperException as exc:  # usage errors (click's ClickException)
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        else:
            err.print(f"error: {exc}", markup=False)
        return 2
    except Exception as exc:  # a bug: still one line; the traceback only with --verbose
        err.print(f"error: internal_error: unexpected {type(exc).__name__}: {exc} (this is a "
                  "bug: rerun with --verbose and report the traceback)", highlight=False)
        if verbose:
            err.print_exception()
        return 2
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
