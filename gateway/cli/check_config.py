"""``gateway check-config --config FILE``: validate a config without serving.

The config file is given as to ``gateway serve``: ``--config FILE`` / ``-c FILE``, or the
``SG_CONFIG`` environment variable. The positional ``check-config FILE`` of earlier releases
still works, with a deprecation warning.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from clishell import CliError, ConfigOpt, not_regular, require_config, warn
from gateway.assembly import assemble
from gateway.config.errors import ConfigProblem, problems_of
from gateway.config.loader import load
from gateway.errors import ConfigError
from gateway.serving.reload import revision_of
from gateway.serving.workers_check import check_workers

__all__ = ["check_config"]


def _report(file: Path, problems: list[ConfigProblem], as_json: bool, code: int) -> typer.Exit:
    """Print one line per problem (``file:line: key: problem``) or, with ``--json``,
    ``{"ok": false, "file", "problems": [{"file", "line", "key", "problem"}, ...]}``; in the
    order of the file (by file, then line; problems without a line after those of their file,
    in the order found)."""
    problems = sorted(problems, key=lambda p: (p.file or "", p.line is None, p.line or 0))
    if as_json:
        typer.echo(json.dumps({"ok": False, "file": str(file),
                               "problems": [p.as_json() for p in problems]}))
    else:
        for problem in problems:
            typer.echo(str(problem), err=True)
    return typer.Exit(code)


def _config_file(config: Path | None, legacy_file: Path | None) -> Path:
    """``--config`` (or ``SG_CONFIG``), else the deprecated positional file (with a warning).

    Raises:
        CliError: Neither given (usage error, exit 2).
    """
    if legacy_file is not None:
        # An explicit argument wins over SG_CONFIG from the environment, as it did before.
        warn("gateway", "deprecated", "check-config FILE (the config file as an argument)",
             hint=f"use check-config --config {legacy_file}, as for serve")
        return legacy_file
    return require_config(config)


def check_config(
    config: ConfigOpt = None,
    legacy_file: Annotated[Path | None, typer.Argument(
        metavar="FILE", show_default=False,
        help="Deprecated: the config file as an argument; use --config FILE.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    workers: Annotated[int, typer.Option(
        min=1, envvar="SG_WORKERS",
        help="Check for `gateway serve --workers N` too (as serve: SG_WORKERS): refuses what "
             "N worker processes cannot share (memory quotas, in-memory stores, an in_flight "
             "threshold below N).")] = 1,
) -> None:
    """Validate the config (and its policy file and replica bindings) without serving.

    Prints one line per problem, FILE:LINE: KEY: PROBLEM. Exit 0 valid, 1 invalid,
    2 unreadable. With --workers N (or SG_WORKERS, read as serve reads it) it also
    refuses what 'gateway serve --workers N' refuses.
    """
    file = _config_file(config, legacy_file)
    reason = None
    try:  # unreadable (exit 2) apart from invalid (exit 1), with the reason
        if not not_regular(file):  # a pipe (`<(envsubst ...)`) is read once, by load, as serve
            with file.open("rb"):
                pass
            reason = None if file.is_file() else "not a regular file"
    except OSError as exc:
        reason = exc.strerror or str(exc)
    if reason is not None:
        # Not a problem of the config (no line, no key): an I/O error in the shared form, with
        # what to do. --json keeps its document, the problem in "problems" as before.
        problem = ConfigProblem("(top level)", f"cannot read config file: {reason}", str(file))
        hint = "check the path given with --config (or SG_CONFIG) and its permissions"
        message = f"{file}: cannot read config file: {reason}"
        raise CliError("io_error", message, hint=hint, document={
            "ok": False, "file": str(file), "problems": [problem.as_json()],
            "error": {"code": "io_error", "message": message, "hint": hint}})
    try:
        settings = load(file, os.environ)
    except ConfigError as exc:
        raise _report(file, problems_of(exc, file=str(file)), as_json, 1) from exc
    try:
        # The same assembly as `gateway serve` (without the process guard); no store is opened.
        assembled = assemble(settings, file.parent)
        check_workers(settings, workers)
    except ConfigError as exc:
        raise _report(file, settings.problems_of(exc), as_json, 1) from exc
    policy = assembled.policy
    telemetry = assembled.telemetry.settings if assembled.telemetry is not None else None
    identity = settings.identity
    summary = {
        "ok": True,
        "file": str(file),
        # What a live reload of this file would record as its new revision (gateway.serving.reload).
        "revision": revision_of(settings, policy),
        "listen": f"{settings.listen.host}:{settings.listen.port}",
        "workers": workers,
        "models": {
            m.name: {
                "aliases": m.aliases,
                "served_model_name": m.upstream_name,
                "replicas": [r.url for r in m.replicas],
                "strategy": m.strategy,
            }
            for m in settings.models
        },
        "keys": [k.id for k in settings.keys],
        "policy": None if policy is None else {
            "file": policy.source,
            "revision": policy.revision,
            "unsafe_allow_all": policy.unsafe_allow_all,
        },
        # Each rule's one source (gateway.identity.settings.IdentityRule.issuer): whose
        # identities it may decide, written or implicit (the only source configured).
        "identity": None if identity is None else {
            "sources": identity.sources,
            "rules": [{"id": r.id, "source": identity.source_of(r), "implicit": r.issuer is None}
                      for r in identity.rules],
        },
        "telemetry": None if telemetry is None else {
            "otlp_endpoint": telemetry.otlp_endpoint,
            "admin": f"{telemetry.admin.host}:{telemetry.admin.port}",
        },
    }
    if as_json:
        typer.echo(json.dumps(summary))
        return
    typer.echo(f"{file}: OK (listen {summary['listen']})")
    for m in settings.models:
        aliases = f" (aliases: {', '.join(m.aliases)})" if m.aliases else ""
        typer.echo(f"  model {m.name}{aliases} -> {m.upstream_name}, {len(m.replicas)} replica(s)")
    typer.echo(f"  {len(settings.keys)} key(s): {', '.join(k.id for k in settings.keys)}")
    if identity is not None:
        typer.echo(f"  identity sources: {', '.join(identity.sources) or '-'}")
        for r in identity.rules:
            implicit = " (implicit: the only source)" if r.issuer is None else ""
            typer.echo(f"    rule {r.id}: {identity.source_of(r) or '-'}{implicit}")
    if telemetry is not None:
        typer.echo(f"  telemetry: /metrics on {telemetry.admin.host}:{telemetry.admin.port}, "
                   f"OTLP {telemetry.otlp_endpoint or 'off'}")
    if policy is not None:
        typer.echo(f"  policy {policy.source} ({policy.revision}): every replica inside its "
                   "destination")
        if policy.unsafe_allow_all:
            typer.echo("  WARNING: the policy has unsafe_allow_all on (development only)")
    typer.echo(f"  revision {summary['revision']} (what a live reload of this file records)")
