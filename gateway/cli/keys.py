"""``gateway keys new`` and ``gateway keys hash``: create keys and their config lines."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from gateway.auth import digest_key, new_key

__all__ = ["app"]

app = typer.Typer(help="Create API keys (only their SHA-256 goes into the config).",
                  no_args_is_help=True)


def _config_line(key_id: str, digest: str, models: list[str], team: str | None) -> str:
    fields = [f"id: {key_id}", f"sha256: {digest}", f"models: [{', '.join(models)}]"]
    if team:
        fields.append(f"team: {team}")
    return "  - {" + ", ".join(fields) + "}"


@app.command("new")
def new(
    key_id: Annotated[str, typer.Option("--id", help="Key id (logged; not secret).")],
    model: Annotated[
        list[str] | None, typer.Option("--model", "-m", help="Allowed model (repeatable).")
    ] = None,
    team: Annotated[str | None, typer.Option(help="Team the key belongs to.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Print a fresh random key ONCE, and the config line holding its SHA-256."""
    key = new_key()
    digest = digest_key(key).hex()
    models = model or ["*"]
    if as_json:
        typer.echo(json.dumps({"id": key_id, "key": key, "sha256": digest, "models": models,
                               "team": team}))
        return
    typer.echo(f"key:  {key}")
    typer.echo("      (shown once: store it in your secret manager; the gateway keeps its hash)")
    typer.echo("config line (under keys:):")
    typer.echo(_config_line(key_id, digest, models, team))


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
