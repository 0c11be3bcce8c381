"""``weights lock DIR``: lock weights already on disk (registered on the app by weights.cli)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from clishell.consoles import print_wrapped
from clishell.text import human_bytes
from weights.cli_common import (
    JsonOpt,
    LockOpt,
    QuietOpt,
    diagnostics_console,
    drift_json,
    print_drift,
    progress,
    show_drift_refusal,
)
from weights.cli_common import console as _console
from weights.errors import DriftError
from weights.serialisation import SerialisationPolicy


def lock(
    directory: Annotated[Path, typer.Argument(help="Model directory or HF cache snapshot.")],
    repo_id: Annotated[
        str | None, typer.Option("--repo-id", help="Name in the lockfile (org/name).")
    ] = None,
    revision: Annotated[str, typer.Option("--revision", help="Revision name for refs/.")] = "main",
    claim_repo: Annotated[
        str | None, typer.Option("--claim-repo", help="Declared upstream repo (not verified).")
    ] = None,
    claim_commit: Annotated[
        str | None, typer.Option("--claim-commit", help="Declared upstream commit (not verified).")
    ] = None,
    lock_path: LockOpt = Path("weights.lock"),
    update: Annotated[bool, typer.Option("--update", help="Accept drift.")] = False,
    allow_pickle: Annotated[bool, typer.Option(
        "--allow-pickle", help="Accept pickle-based files the allowlist scanner finds safe.")
    ] = False,
    allow_remote_code: Annotated[bool, typer.Option(
        "--allow-remote-code", help="Stage Python files and auto_map configs "
        "(trust_remote_code).")] = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Lock a directory already on disk (no network): digest every file, record its origin."""
    from weights.local import lock_local

    console = _console()
    total = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file()) \
        if directory.is_dir() else 0
    try:
        with progress(total, f"locking {directory.name}", quiet or as_json) as advance:
            result = lock_local(
                lock_path, directory, update=update, repo_id=repo_id, revision=revision,
                claimed_repo_id=claim_repo, claimed_commit=claim_commit,
                policy=SerialisationPolicy(allow_pickle=allow_pickle,
                                           allow_remote_code=allow_remote_code),
                progress=advance)
    except DriftError as exc:
        show_drift_refusal(diagnostics_console(), exc, as_json)
        raise
    e = result.entry
    if as_json:
        print(json.dumps({"ok": True, "written": result.written, "entry": e.to_json(),
                          "drift": drift_json(result.drift)}, indent=2, ensure_ascii=False))
        return
    if result.written and result.previous is not None:
        print_drift(console, result.drift)
    state = "locked" if result.written else "unchanged"
    claim = ""
    if e.origin is not None and (e.origin.claimed_repo_id or e.origin.claimed_commit):
        claim = (f", claims {e.origin.claimed_repo_id or '?'}@"
                 f"{e.origin.claimed_commit or '?'} (not verified)")
    print_wrapped(console, f"{state} {e.repo_id} from {directory} -> {e.commit} "
                           f"({len(e.files)} files, {human_bytes(e.total_bytes)}, licence "
                           f"{e.license or 'unknown'}{claim}) in {lock_path}")
