"""``weights`` command line: pin, pull, verify, sign, size.

Exit codes: 0 ok; 1 verification failed (digest or signature mismatch, missing/extra files,
drift refused, model does not fit); 2 usage or I/O error; interrupted by SIGINT/SIGTERM/SIGHUP:
the process ends by that signal after cleaning up (a shell sees 130/143/129). Only ``pin``
and ``pull`` (and ``size REPO_ID``) use the network, and only towards ``--endpoint`` /
``HF_ENDPOINT``; :mod:`weights.hub` is imported lazily by those commands. With ``--offline``
(``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``) they contact nothing: ``hub_offline``, exit 2.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from clishell import EXIT_FAILED, CliError, VerboseOpt, VersionOpt, existing_public_key, run
from clishell.consoles import print_wrapped
from clishell.text import human_bytes
from weights.cli_common import (
    EndpointOpt,
    JsonOpt,
    LockOpt,
    OfflineOpt,
    QuietOpt,
    RedirectHostOpt,
    TokenOpt,
    VerificationFailed,
    diagnostics_console,
    drift_json,
    dump_json,
    hub_client,
    print_drift,
    progress,
    show_drift_refusal,
)
from weights.cli_common import console as _console
from weights.errors import (
    DigestMismatchError,
    DriftError,
    EntryNotInLockError,
    SignatureVerificationError,
    UnsafeSerialisationError,
    WeightsError,
)
from weights.lockfile import LockEntry, Lockfile
from weights.modeltree import UnsafeTreeError
from weights.serialisation import SerialisationPolicy
from weights.verify import VerifyReport

app = typer.Typer(
    name="weights",
    help="Pin, pull, verify, sign and size Hugging Face model weights.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_VERIFY_FAILURES = (DigestMismatchError, SignatureVerificationError, DriftError,
                    UnsafeSerialisationError, UnsafeTreeError)
AllowPickleOpt = Annotated[bool, typer.Option(
    "--allow-pickle", help="Accept pickle-based files that the allowlist scanner finds safe.")]
AllowCodeOpt = Annotated[bool, typer.Option(
    "--allow-remote-code", help="Stage Python files and auto_map configs (trust_remote_code).")]


@app.callback()
def _root(version: VersionOpt = False, verbose: VerboseOpt = False) -> None:
    """Pin, pull, verify, sign and size Hugging Face model weights."""


@app.command()
def pin(
    repo_id: Annotated[str, typer.Argument(help="Repository id, e.g. org/name.")],
    revision: Annotated[str, typer.Option("--revision", help="Branch, tag or SHA.")] = "main",
    include: Annotated[list[str] | None, typer.Option("--include", help="Glob to pin.")] = None,
    exclude: Annotated[list[str] | None, typer.Option("--exclude", help="Glob to skip.")] = None,
    lock: LockOpt = Path("weights.lock"),
    update: Annotated[bool, typer.Option("--update", help="Accept drift.")] = False,
    allow_license: Annotated[
        list[str] | None, typer.Option("--allow-license", help="Refuse other licences.")
    ] = None,
    endpoint: EndpointOpt = "https://huggingface.co",
    token: TokenOpt = None,
    redirect_host: RedirectHostOpt = None,
    offline: OfflineOpt = False,
    as_json: JsonOpt = False,
    allow_pickle: AllowPickleOpt = False,
    allow_remote_code: AllowCodeOpt = False,
) -> None:
    """Resolve REPO_ID at a revision to its commit and record every file's digests."""
    from weights.pin import pin as do_pin

    console = _console()
    try:
        hub = hub_client(endpoint, token, redirect_host, offline)
        result = do_pin(hub, lock, repo_id, revision,
                        include=include or (), exclude=exclude or (),
                        allow_license=allow_license or (), update=update,
                        policy=SerialisationPolicy(allow_pickle=allow_pickle,
                                                    allow_remote_code=allow_remote_code))
    except DriftError as exc:
        show_drift_refusal(diagnostics_console(), exc, as_json)
        raise
    e = result.entry
    if as_json:
        print(json.dumps({"ok": True, "written": result.written, "entry": e.to_json(),
                          "drift": drift_json(result.drift), "warnings": list(result.warnings)},
                         indent=2, ensure_ascii=False))
        return
    for w in result.warnings:
        diagnostics_console().print(f"warning: {w}", markup=False)
    if result.written and result.previous is not None:
        print_drift(console, result.drift)
    state = "pinned" if result.written else "unchanged"
    print_wrapped(console, f"{state} {e.repo_id}@{e.requested_revision} -> {e.commit} "
                           f"({len(e.files)} files, {human_bytes(e.total_bytes)}, licence "
                           f"{e.license or 'unknown'}) in {lock}")


@app.command()
def pull(
    lock: LockOpt = Path("weights.lock"),
    into: Annotated[Path | None, typer.Option("--into", help="Plain directory.")] = None,
    cache: Annotated[Path | None, typer.Option("--cache", help="HF cache root.")] = None,
    repo: Annotated[list[str] | None, typer.Option("--repo", help="Only this repo id.")] = None,
    endpoint: EndpointOpt = "https://huggingface.co",
    token: TokenOpt = None,
    redirect_host: RedirectHostOpt = None,
    offline: OfflineOpt = False,
    quiet: QuietOpt = False,
    allow_pickle: AllowPickleOpt = False,
    allow_remote_code: AllowCodeOpt = False,
) -> None:
    """Download exactly the pinned commit's files, verifying each before it becomes visible."""
    from weights.pull import plain_dir_for, pull_entry, select_entries

    if (into is None) == (cache is None):
        raise typer.BadParameter("give exactly one of --into DIR or --cache DIR")
    entries = select_entries(_nonempty(Lockfile.load(lock), lock), repo or [])
    hub = hub_client(endpoint, token, redirect_host, offline)
    console = _console()
    for entry in entries:
        dest = plain_dir_for(into, entry, len(entries) > 1) if into is not None else None
        with progress(entry.total_bytes, entry.repo_id, quiet) as advance:
            result = pull_entry(hub, entry, into=dest, cache=cache, progress=advance,
                                policy=SerialisationPolicy(allow_pickle=allow_pickle,
                                                    allow_remote_code=allow_remote_code))
        if result.resumed:  # even with --quiet: the operator should know a run did not finish
            diagnostics_console().print(
                f"{entry.repo_id}: resumed {result.resumed} file(s) left by an earlier run "
                "that did not finish (interrupted or failed)", markup=False)
        if not quiet:
            console.print(f"{entry.repo_id}@{entry.commit[:12]}: {len(result.downloaded)} "
                          f"downloaded, {len(result.reused)} already present -> {result.target}")


def _nonempty(lockfile: Lockfile, path: Path) -> Lockfile:
    if not lockfile.entries:
        raise EntryNotInLockError(f"{path} pins no model",
                                  hint="pin one first with `weights pin REPO_ID`")
    return lockfile


def _pick_entries(
    lock: Lockfile, path: Path, repo: str | None
) -> list[tuple[LockEntry, Path, bool]]:
    """Which pinned models ``path`` holds: (entry, directory to verify, present).

    One model: ``--repo``, a lock of one entry, a path inside ``models--org--name`` or ending
    in ``org/name``. Several: a cache root or a ``pull --into`` directory holding any pinned
    model; then EVERY pinned model is verified (an absent one has all its files missing).
    """
    if repo is not None:
        return [(lock.entry(repo), path, True)]
    if len(lock.entries) == 1:
        return [(lock.entries[0], path, True)]
    from weights.cache import repo_folder_name

    parts = path.resolve().parts
    for e in lock.entries:
        if repo_folder_name(e.repo_id) in parts or parts[-2:] == tuple(e.repo_id.split("/")):
            return [(e, path, True)]
    cached = [(e, path, (path / repo_folder_name(e.repo_id)).is_dir()) for e in lock.entries]
    if any(present for _, _, present in cached):
        return cached
    nested = [(e, path / e.repo_id, (path / e.repo_id).is_dir()) for e in lock.entries]
    if any(present for _, _, present in nested):
        return nested
    raise WeightsError(f"the lockfile pins {len(lock.entries)} models; which one is {path}?",
                       hint="pass --repo REPO_ID")


def _absent(entry: LockEntry, where: Path) -> VerifyReport:
    return VerifyReport(where, entry.repo_id, entry.commit, 0, 0, (),
                        tuple(f.path for f in entry.files), (), ())


def _print_report(console: Console, report: VerifyReport, lock: Path, several: bool) -> None:
    tag = f"{report.repo_id}: " if several else ""
    for m in report.mismatched:
        console.print(f"{tag}MISMATCH {m.path}: expected {m.expected}, got {m.actual}",
                      markup=False)
    for p in report.missing:
        console.print(f"{tag}MISSING  {p}", markup=False)
    for p in report.extra:
        console.print(f"{tag}EXTRA    {p}", markup=False)
    for p in report.missing_shards:
        console.print(f"{tag}MISSING SHARD {p} (named in the index)", markup=False)
    for m in report.refs:
        got = m.actual.removeprefix("commit:")
        console.print(f"{tag}REF      {m.path}: " + ("absent (a loader finds no revision "
                      f"{m.path[5:]})" if m.actual == "absent" else
                      f"names {got!r}, the lock pins {report.commit} (a loader reads "
                      f"snapshots/{got})"), markup=False)
    for p in report.extra_snapshots:
        console.print(f"{tag}NOTE     other snapshot {p}: no ref names it; only a load by "
                      "that commit reads it", markup=False)
    if report.ok:
        console.print(f"OK {report.repo_id}@{report.commit[:12]}: {report.checked} "
                      f"files, {report.bytes_checked} bytes match {lock}", markup=False)


@app.command()
def verify(
    path: Annotated[Path, typer.Argument(help="Model dir, HF cache snapshot, repo dir or root.")],
    lock: LockOpt = Path("weights.lock"),
    repo: Annotated[str | None, typer.Option("--repo", help="Repo id in the lock.")] = None,
    ignore: Annotated[list[str] | None, typer.Option("--ignore", help="Glob not extra.")] = None,
    signature: Annotated[Path | None, typer.Option("--signature", help="model.sig.")] = None,
    public_key: Annotated[Path | None, typer.Option(
        "--public-key", help="EC public key (PEM) of `weights keygen`.")] = None,
    identity: Annotated[str | None, typer.Option("--identity", help="Keyless signer.")] = None,
    identity_provider: Annotated[
        str | None, typer.Option("--identity-provider", help="OIDC issuer of --identity.")
    ] = None,
    trust_root: Annotated[
        Path | None, typer.Option("--trust-root", help="Sigstore trusted_root.json (keyless).")
    ] = None,
    no_lock: Annotated[bool, typer.Option("--no-lock", help="Signature only.")] = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Offline: check files against the lock (and a signature); exit 0 ok, 1 failed, 2 error."""
    from weights.verify import verify_tree

    report_doc: dict[str, Any] = {}
    ok = True
    console = _console()
    patterns = list(ignore or [])
    if signature is not None and signature.resolve().is_relative_to(path.resolve()):
        patterns.append(signature.resolve().relative_to(path.resolve()).as_posix())
    report: VerifyReport | None = None
    if not no_lock:
        picked = _pick_entries(_nonempty(Lockfile.load(lock), lock), path, repo)
        if len(picked) > 1 and signature is not None:
            raise typer.BadParameter("--signature covers one model: pass --repo REPO_ID")
        reports = []
        for entry, where, present in picked:
            if not present:
                report = _absent(entry, where)
            else:
                with progress(entry.total_bytes, f"verify {entry.repo_id}",
                              quiet or as_json) as adv:
                    report = verify_tree(where, entry, ignore=patterns, progress=adv)
            reports.append(report)
            ok = ok and report.ok
            if not as_json:
                _print_report(console, report, lock, len(picked) > 1)
        if len(picked) > 1:
            report_doc["models"] = [r.to_json() for r in reports]
        else:
            report_doc["lock"] = reports[0].to_json()
    if signature is not None:
        from weights.signing import verify_signature

        root = path if report is None else report.root
        try:
            key = None if public_key is None else existing_public_key(public_key, "weights")
            signed = verify_signature(root, signature, public_key=key, identity=identity,
                                      identity_provider=identity_provider, trust_root=trust_root,
                                      ignore=patterns,
                                      digests=None if report is None else report.digests)
            report_doc["signature"] = {"ok": True, "files": len(signed)}
            if not as_json:
                console.print(f"OK signature {signature}: {len(signed)} files")
        except SignatureVerificationError as exc:
            ok = False
            report_doc["signature"] = {"ok": False, "error": exc.message}
            if not as_json:
                console.print(f"SIGNATURE INVALID {signature}: {exc.message}")
    elif no_lock:
        raise typer.BadParameter("--no-lock needs --signature")
    if as_json:
        report_doc["ok"] = ok
        print(dump_json(report_doc))
    if not ok:
        raise VerificationFailed()


def _describe(exc: BaseException) -> CliError | None:
    """The weights errors that are a failed verification (exit 1); the rest exit 2."""
    if isinstance(exc, _VERIFY_FAILURES):  # pin/lock --json printed the drift already
        return CliError(exc.code, exc.message, hint=exc.hint, exit_code=EXIT_FAILED,
                        document={} if isinstance(exc, DriftError) else None)
    return None


def _setup(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI behind the shared boundary (:func:`clishell.run`); return the
    exit status."""
    return run(app, argv, prog="weights", describe=_describe, setup=_setup)


def _register() -> None:
    from weights.cli_extra import keygen, sign, size
    from weights.cli_local import lock
    from weights.cli_plan import plan

    app.command()(keygen)
    app.command()(lock)
    app.command()(sign)
    app.command()(size)
    app.command()(plan)


_register()

if __name__ == "__main__":
    sys.exit(main())
