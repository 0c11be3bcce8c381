"""``airgap`` command line: keygen, pack, verify, unpack, inspect.

Each command parses, calls the public API and renders. ``main()`` is the shared error boundary
(:func:`clishell.run`): exit 0 ok, 1 verification failed (bundle, signature or content not
trusted), 2 usage or I/O, 128 + signal when interrupted; ``-v``/``--verbose`` shows tracebacks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from airgap.bundle import DEFAULT_PART_SIZE, INDEX_NAME, MAX_INDEX_BYTES, SIGNATURE_NAME, Index
from airgap.errors import AirgapError, Code, Problem, VerificationFailed
from airgap.media import check_bundle_dir, read_small
from airgap.signing import MAX_SIGNATURE_BYTES, load_public_key, signer_key_id
from airgap.stream import default_workers
from airgap.verify import MAX_SHOWN_PROBLEMS, problems_json, verify_bundle
from clishell import (
    EXIT_FAILED,
    CliError,
    VerboseOpt,
    VersionOpt,
    existing_public_key,
    invoke,
    run,
)
from weights import (
    EmptyModelError,
    Lockfile,
    PathCollisionError,
    SerialisationPolicy,
    WeightsError,
)

if TYPE_CHECKING:
    from rich.console import Console

    from airgap.unpack import Layout

# Start-up cost matters for `airgap verify` (docs/airgap.md, "Measured performance"): rich,
# pack, unpack, the ML-BOM writer and the private-key code load only in the commands that use
# them, and the consoles are created on first use.
app = typer.Typer(
    name="airgap",
    help="Carry pinned, verified model weights across an air gap as a signed bundle.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class _LazyConsole:
    """A rich ``Console`` created (and rich imported) on first attribute access.

    Args:
        stderr: Write to standard error instead of standard output.
    """

    def __init__(self, *, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        if self._console is None:
            from rich.console import Console

            # markup off: file names, paths and revisions such as "a[/b]" print as they are.
            self._console = Console(stderr=self._stderr, soft_wrap=True, markup=False)
        return getattr(self._console, name)


err: Any = _LazyConsole(stderr=True)
out: Any = _LazyConsole(stderr=False)

AllowPickle = Annotated[bool, typer.Option(
    "--allow-pickle", help="Accept pickle-based files scanned safe by the allowlist scanner.")]
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
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
               TransferSpeedColumn(), TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def _styled_stdout() -> bool:
    """Whether rich would style standard output (its ``Console.is_terminal`` rules).

    ``TTY_COMPATIBLE`` 0/1, then ``FORCE_COLOR`` (https://force-color.org/: set and not empty),
    then ``isatty()``.
    """
    tty_compatible = os.environ.get("TTY_COMPATIBLE", "")
    if tty_compatible in ("0", "1"):
        return tty_compatible == "1"
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None:
        return force_color != ""
    try:
        return sys.stdout.isatty()
    except ValueError:  # closed
        return False


def _print_json(doc: dict[str, Any]) -> None:
    """Print a JSON document indented by 2, as rich's ``print_json`` does; plain (rich not
    loaded) unless standard output is a terminal that gets highlighting."""
    if _styled_stdout():
        out.print_json(json.dumps(doc))
    else:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def _print_line(text: str) -> None:
    """Print one result line; plain (rich not loaded, paths exactly as they are, no
    ``:emoji:`` codes replaced) unless standard output is a terminal that gets highlighting."""
    if _styled_stdout():
        out.print(text)
    else:
        sys.stdout.write(text + "\n")


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


def _trusted_keys(paths: Sequence[Path]) -> list[Any]:
    """Load the ``--public-key`` files (an old ``KEY.pub.pem`` name is still found)."""
    return [load_public_key(existing_public_key(p, "airgap")) for p in paths]


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
    """Create an Ed25519 signing key (KEY.pem, mode 0600) and its public key (KEY.pub)."""
    from airgap.signing import generate_keypair

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
    allow_pickle: AllowPickle = False,
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
                             policy=SerialisationPolicy(allow_pickle=allow_pickle),
                             since=since)  # fmt: skip
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
    keys = _trusted_keys(public_key)
    check_bundle_dir(bundle)
    total = _peek_payload(bundle) if _shows_progress(quiet or as_json) else 0
    with _progress(total, "verifying", quiet or as_json) as progress:
        report = verify_bundle(bundle, keys, expected_lock=_load_lock(expected_lock),
                               workers=_workers(workers), all_parts=all_parts,
                               progress=progress)  # fmt: skip
    if as_json:
        _print_json(report.to_json())
    elif report.ok:
        rate = report.bytes_hashed / max(report.seconds, 1e-9) / 1024**3
        _print_line(f"OK {bundle}: signed by {report.signer}, {report.bytes_hashed} bytes "
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
    allow_pickle: AllowPickle = False,
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
                               policy=SerialisationPolicy(allow_pickle=allow_pickle))  # fmt: skip
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
    from rich.table import Table

    from airgap.mlbom import BOM_NAME, read_extra, summary

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
    bom = read_extra(bundle, index, BOM_NAME)
    for line in summary(bom) if bom is not None else ["ML-BOM: none in this bundle"]:
        out.print(line, highlight=False)
    if index.base is not None:
        out.print(f"delta bundle: {len(index.base.blobs)} blob(s) "
                  f"({sum(b.size for b in index.base.blobs)} bytes) expected in the store from "
                  f"base index sha256 {index.base.index_sha256}")
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


@app.command("oci-export")
def oci_export(
    bundle: Annotated[Path, typer.Argument(help="Bundle directory.")],
    public_key: PublicKeys,
    out_dir: Annotated[Path, typer.Option("--out", help="OCI image layout to create.")],
    repo: Annotated[str | None, typer.Option("--repo", help="Model of the bundle.")] = None,
    tag: Annotated[str | None, typer.Option("--tag", help="Reference name.")] = None,
    allow_pickle: AllowPickle = False,
) -> None:
    """Verify a bundle and write one model as an OCI artifact (CNCF ModelPack media types)."""
    from airgap.oci import export_oci

    keys = _trusted_keys(public_key)
    export_oci(bundle, keys, out_dir, repo_id=repo, tag=tag,
               policy=SerialisationPolicy(allow_pickle=allow_pickle))
    out.print(f"wrote OCI layout {out_dir}; push with: skopeo copy oci:{out_dir}:TAG "
              "docker://REGISTRY/NAME:TAG")


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
        out.print_json(json.dumps({"ok": report.ok, "repo_id": report.repo_id,
                                   "commit": report.commit, "signer_key_id": report.signer,
                                   "layers": report.layers,
                                   "problems": [p.to_json() for p in report.problems]}))
    elif report.ok:
        out.print(f"OK {layout}: {report.repo_id}@{report.commit}, {len(report.layers)} "
                  f"layers match the pins, signed by {report.signer}")
    else:
        _print_problems(report.problems, "FAIL ")
    if not report.ok:
        raise typer.Exit(1)


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


@app.callback()
def _root(version: VersionOpt = False, verbose: VerboseOpt = False) -> None:
    """Air-gap bundles for sovereign-gateway."""


#: `airgap verify` options the fast parser takes: option -> (parameter, takes a value,
#: repeatable). Kept equal to the typer command's by tests/airgap/test_cli_startup.py.
_VERIFY_OPTIONS: dict[str, tuple[str, bool, bool]] = {
    "--public-key": ("public_key", True, True),
    "-k": ("public_key", True, True),
    "--lock": ("expected_lock", True, False),
    "--all-parts": ("all_parts", False, False),
    "--json": ("as_json", False, False),
    "--workers": ("workers", True, False),
    "--quiet": ("quiet", False, False),
    "-q": ("quiet", False, False),
}


def _fast_verify_args(args: Sequence[str]) -> dict[str, Any] | None:
    """Keyword arguments of ``verify`` for a plain, well-formed ``verify`` command line.

    typer's parser builds a pydantic TypeAdapter per parameter on first use, which costs about
    0.25 CPU-s of start-up (pydantic's import) on every ``airgap verify``. This parser takes
    only the unambiguous forms (``--opt VALUE``, ``--opt=VALUE``, ``-k VALUE``, flags, one
    bundle argument) and returns None for anything else (help, unknown or repeated options,
    ``--``, bundled short flags, a bad number, a missing key), which then goes through typer
    as before, so every error message and exit code stays typer's.

    Args:
        args: The command line after the program name, ``--verbose`` already removed.

    Returns:
        The keyword arguments for :func:`verify`, or None to let typer parse.
    """
    if not args or args[0] != "verify":
        return None
    kwargs: dict[str, Any] = {"public_key": [], "expected_lock": None, "all_parts": False,
                              "as_json": False, "workers": 0, "quiet": False}
    bundle: Path | None = None
    seen: set[str] = set()
    rest = list(args[1:])
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("-") and arg:
            if bundle is not None:
                return None
            bundle = Path(arg)
            continue
        name, eq, inline = arg.partition("=")
        spec = _VERIFY_OPTIONS.get(name)
        if spec is None or (eq and (not spec[1] or not name.startswith("--"))):
            return None
        param, takes_value, repeatable = spec
        if param in seen and not repeatable:
            return None
        seen.add(param)
        if not takes_value:
            kwargs[param] = True
            continue
        if eq:
            value = inline
        elif rest and not rest[0].startswith("-"):
            value = rest.pop(0)
        else:
            return None
        if not value:
            return None
        if param == "workers":
            if not value.isascii() or not value.isdigit():
                return None
            kwargs[param] = int(value)
        elif param == "public_key":
            kwargs[param].append(Path(value))
        else:
            kwargs[param] = Path(value)
    if bundle is None or not kwargs["public_key"]:
        return None
    kwargs["bundle"] = bundle
    return kwargs


def _run(args: list[str]) -> Any:
    """Run one command: ``verify`` through the fast parser when it can, else through typer."""
    fast = _fast_verify_args(args)
    if fast is None:
        return invoke(app, args, "airgap")
    try:
        verify(**fast)
    except typer.Exit as exc:
        return exc.exit_code
    return 0


def _describe(exc: BaseException) -> CliError | None:
    """A bundle that is not trusted: one error line per problem (the first
    ``MAX_SHOWN_PROBLEMS``), exit 1, and the problems in the ``--json`` document."""
    if not isinstance(exc, VerificationFailed):
        return None
    shown = [(p.code, f"{p.message}{_detail(p)}") for p in exc.problems[:MAX_SHOWN_PROBLEMS]]
    omitted = len(exc.problems) - len(shown)
    if omitted:
        shown.append(("verification_failed", f"... and {omitted} more problem(s) "
                      f"({len(exc.problems)} in all; fix these first)"))
    (code, message), *more = shown
    return CliError(code, message, exit_code=EXIT_FAILED, more=tuple(more),
                    document={"ok": False, **problems_json(exc.problems)})


def main(argv: list[str] | None = None) -> int:
    """Entry point: the shared CLI boundary (:func:`clishell.run`); returns the exit code."""
    return run(app, argv, prog="airgap", describe=_describe, interruptible=True,
               runner=_run)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
