"""Shared pieces of the ``weights`` CLI: option aliases, console, progress bar, hub factory,
drift rendering."""

from __future__ import annotations

import json
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from clishell.consoles import byte_progress, diagnostics, results
from weights.errors import DriftError


class VerificationFailed(typer.Exit):
    """Raised by a command to exit 1 (verification failed) after it printed its report."""

    def __init__(self) -> None:
        super().__init__(1)


LockOpt = Annotated[
    Path, typer.Option("--lock", help="Lockfile path.")
]
EndpointOpt = Annotated[
    str,
    typer.Option("--endpoint", envvar="HF_ENDPOINT", help="Hub base URL (HF_ENDPOINT)."),
]
TokenOpt = Annotated[
    str | None,
    typer.Option("--token", envvar="HF_TOKEN", help="Hub token for gated repos (HF_TOKEN).",
                 show_default=False),
]
RedirectHostOpt = Annotated[
    list[str] | None,
    typer.Option("--redirect-host", envvar="WEIGHTS_REDIRECT_HOSTS", show_default=False,
                 help="A host the hub may redirect downloads to (repeatable; exact name or "
                      "*.domain; WEIGHTS_REDIRECT_HOSTS, space-separated). Default: *.hf.co, "
                      "the Hub's content hosts. The endpoint's own host is always allowed; "
                      "https to http is always refused."),
]
OfflineOpt = Annotated[
    bool,
    typer.Option("--offline", envvar=["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"],
                 show_default=False,
                 help="Never contact the hub: fail with hub_offline before any name lookup or "
                      "connection (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE = 1/true/yes/on, as "
                      "huggingface_hub reads them)."),
]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable JSON report on stdout.")]


def console() -> Console:
    """The console of a command's result: standard output (``weights plan ... > plan.txt``)."""
    return results()


def diagnostics_console() -> Console:
    """The console of warnings and notes: standard error, next to the progress bar."""
    return diagnostics()


def progress(total: int, label: str, quiet: bool) -> AbstractContextManager[Any]:
    """A rich byte progress bar (bytes, throughput, ETA) on stderr; none if quiet or no TTY."""
    return byte_progress(total, label, quiet)


def hub_client(endpoint: str, token: str | None, redirect_hosts: list[str] | None = None,
               offline: bool = False) -> Any:
    """A :class:`weights.hub.HubClient` (imported here: the only network-capable module);
    ``offline`` (``--offline``, ``HF_HUB_OFFLINE``) makes it refuse every hub request."""
    from weights.hub import HubClient

    return HubClient(endpoint=endpoint, token=token, redirect_hosts=redirect_hosts,
                     offline=offline)



def dump_json(doc: object) -> str:
    """JSON for stdout that is always valid UTF-8: a file name with undecodable bytes
    (``os.fsdecode`` keeps them as lone surrogates) is written as a ``\\udcXX`` escape."""
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = json.dumps(doc, indent=2, ensure_ascii=True)
    return text


def drift_json(drift: Any) -> dict[str, Any] | None:
    """The ``drift`` member of a ``pin``/``lock`` JSON document (``None``: no drift)."""
    if drift is None:
        return None
    return {"repo_id": drift.repo_id, "revision": drift.revision, "old_commit": drift.old_commit,
            "new_commit": drift.new_commit, "added": list(drift.added),
            "removed": list(drift.removed), "changed": list(drift.changed)}


def show_drift_refusal(console: Console, exc: DriftError, as_json: bool) -> None:
    """Show the drift a refused ``pin``/``lock`` found (JSON document or one line a file)."""
    if as_json:
        print(json.dumps({"ok": False, "drift": drift_json(exc.drift)}, indent=2))
    else:
        print_drift(console, exc.drift)


def print_drift(console: Console, drift: Any) -> None:
    """One line for the commit change, then ``+``/``-``/``~`` and a path per changed file."""
    if drift is None:
        return
    console.print(f"drift {drift.repo_id}@{drift.revision}: "
                  f"{drift.old_commit[:12]} -> {drift.new_commit[:12]}")
    for sign, paths in (("+", drift.added), ("-", drift.removed), ("~", drift.changed)):
        for p in paths:
            console.print(f"  {sign} {p}")
