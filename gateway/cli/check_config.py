"""``gateway check-config FILE``: validate a config without serving."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from gateway.assembly import assemble
from gateway.errors import ConfigError
from gateway.settings import load

__all__ = ["check_config"]


def check_config(
    file: Annotated[Path, typer.Argument(help="Gateway YAML config file.")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Validate FILE (and its policy file and replica bindings) without serving.

    Exit 0 valid, 1 invalid, 2 unreadable.
    """
    if not file.is_file():
        msg = f"cannot read config file {file}: not a file"
        if as_json:
            typer.echo(json.dumps({"ok": False, "file": str(file), "error": msg}))
        else:
            typer.echo(f"gateway: error [config_error]: {msg}", err=True)
        raise typer.Exit(2)
    try:
        settings = load(file, os.environ)
        # The same assembly as `gateway serve` (without the process guard); no store is opened.
        assembled = assemble(settings, file.parent)
    except ConfigError as exc:
        if as_json:
            typer.echo(json.dumps({"ok": False, "file": str(file), "error": exc.message}))
        else:
            typer.echo(f"gateway: invalid config: {exc.message}", err=True)
        raise typer.Exit(1) from exc
    policy = assembled.policy
    telemetry = assembled.telemetry.settings if assembled.telemetry is not None else None
    summary = {
        "ok": True,
        "file": str(file),
        "listen": f"{settings.listen.host}:{settings.listen.port}",
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
    if telemetry is not None:
        typer.echo(f"  telemetry: /metrics on {telemetry.admin.host}:{telemetry.admin.port}, "
                   f"OTLP {telemetry.otlp_endpoint or 'off'}")
    if policy is not None:
        typer.echo(f"  policy {policy.source} ({policy.revision}): every replica inside its "
                   "destination")
        if policy.unsafe_allow_all:
            typer.echo("  WARNING: the policy has unsafe_allow_all on (development only)")
