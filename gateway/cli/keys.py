"""``gateway keys new`` and ``gateway keys hash``: create keys and their config lines."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
import yaml
from pydantic import ValidationError

from clishell import CliError
from gateway.auth import KeySettings, digest_key, new_key
from gateway.config.errors import validation_problems

__all__ = ["app"]

app = typer.Typer(help="Create API keys (only their SHA-256 goes into the config).",
                  no_args_is_help=True)


_OPTIONS = {"id": "--id", "models": "--model", "team": "--team", "data_class": "--data-class"}


def _config_line(entry: KeySettings) -> str:
    """The ``keys:`` entry as one YAML flow mapping (``yaml.safe_dump`` quotes what needs it,
    e.g. ``models: ['*']``: a bare ``*`` would start a YAML alias)."""
    fields = entry.model_dump(exclude_none=True)
    flow = yaml.safe_dump(fields, default_flow_style=True, sort_keys=False, width=1 << 16)
    return "  - " + flow.strip()


@app.command("new")
def new(
    key_id: Annotated[str, typer.Option("--id", help="Key id (logged; not secret).")],
    model: Annotated[
        list[str] | None, typer.Option(
            "--model", "-m",
            help="Allowed model (repeatable; required): a served model name, an alias, or "
                 "'*' for every model (as `keys create` requires).")
    ] = None,
    team: Annotated[str | None, typer.Option(help="Team the key belongs to.")] = None,
    data_class: Annotated[
        str, typer.Option("--data-class", help="Default data class of the key's requests.")
    ] = "internal",
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Print a fresh random key ONCE, and the config line holding its SHA-256.

    The config line is validated like the config file's keys: entries, so what is printed
    loads (a bad --id exits 2 naming the option). --model is required: a key for every
    model is asked for with --model '*', never a default.
    """
    if not model:  # least privilege: a key for every model is asked for, never a default
        raise CliError("usage_error",
                       "--model: at least one --model NAME is required ('*' for every model)")
    key = new_key()
    try:
        entry = KeySettings(id=key_id, sha256=digest_key(key).hex(), models=model,
                            team=team, data_class=data_class)
    except ValidationError as exc:
        found = [(_OPTIONS.get(p.key.split("[")[0], p.key), p.problem)
                 for p in validation_problems(exc)]
        raise CliError("usage_error", f"{found[0][0]}: {found[0][1]}",
                       more=tuple(("usage_error", f"{o}: {p}") for o, p in found[1:])) from exc
    if as_json:
        typer.echo(json.dumps({"id": entry.id, "key": key, "sha256": entry.sha256,
                               "models": entry.models, "team": entry.team,
                               "data_class": entry.data_class}))
        return
    typer.echo(f"key:  {key}")
    typer.echo("      (shown once: store it in your secret manager; the gateway keeps its hash)")
    typer.echo("config line (under keys:):")
    typer.echo(_config_line(entry))


@app.command("hash")
def hash_key() -> None:
    """Read a key on stdin and print its SHA-256 (for keys created elsewhere)."""
    key = sys.stdin.readline().strip()
    if not key:
        raise typer.BadParameter("no key on stdin")
    typer.echo(digest_key(key).hex())


# Managed keys: create / list / revoke / rotate, from gateway/cli/keys_managed.py.
from gateway.cli import keys_managed as _managed  # noqa: E402

app.registered_commands.extend(_managed.app.registered_commands)
