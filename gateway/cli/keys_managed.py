"""``gateway keys create|list|revoke|rotate``: managed keys (stored hashed, audited).

The store is ``--store URL`` (``sqlite:///PATH`` or ``postgresql://...``, env
``SG_KEYSTORE_URL``), or else the ``keystore.store`` / ``audit.store`` of ``--config FILE``.
Every change is appended to the audit log configured in ``--config`` (its ``audit:`` section)
before it is applied, as a chain of its own (replica id ``<replica>.keys-cli``). Running a
change without an audit log needs an explicit ``--no-audit``.

Exit codes: 0 ok, 2 usage or I/O error (unknown key, store unreachable, invalid option).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import getpass
import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from clishell import CliError, ConfigOpt, run, warn
from gateway.keystore import (
    IssuedKey,
    KeyManager,
    KeystoreError,
    ManagedKey,
    open_keystore,
)

__all__ = ["app", "parse_duration"]

T = TypeVar("T")

app = typer.Typer(
    help="Managed keys: created at run time, stored hashed in the audit store's database.",
    no_args_is_help=True,
)

StoreOpt = Annotated[
    str | None,
    typer.Option("--store", envvar="SG_KEYSTORE_URL", help="sqlite:///PATH or postgresql://..."),
]
NoAuditOpt = Annotated[
    bool, typer.Option("--no-audit", help="UNSAFE: change keys without an audit record.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION_RE = re.compile(r"^(?:(\d+)([smhdw]))+$")


def parse_duration(text: str) -> float:
    """Parse ``30d``, ``1h``, ``90m``, ``1h30m``, ``45s``, ``2w`` into seconds.

    Raises:
        typer.BadParameter: not such a duration.
    """
    text = text.strip().lower()
    if not _DURATION_RE.match(text):
        raise typer.BadParameter(f"invalid duration {text!r}: use e.g. 30d, 12h, 90m, 1h30m")
    return float(sum(int(n) * _UNITS[u] for n, u in re.findall(r"(\d+)([smhdw])", text)))


def _fail(message: str, code: str = "keys_error", hint: str | None = None) -> CliError:
    """A failure of a ``gateway keys`` command, printed by the CLI boundary (exit 2)."""
    return CliError(code, message, hint=hint)


def _config_sections(config: Path | None) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """Return the raw ``keystore`` and ``audit`` sections of the gateway config, if any."""
    if config is None:
        return None, None
    from gateway.config.loader import load
    from gateway.errors import GatewayError

    try:
        # Key management needs no backend credential: VLLM_KEY need not be set on the
        # operator's workstation (check-config and serve still require it).
        settings = load(config, os.environ, secrets=False)
    except GatewayError as exc:
        raise _fail(exc.message, exc.code) from exc
    keystore = getattr(settings, "keystore", None)
    audit = getattr(settings, "audit", None)

    def raw(section: Any) -> dict[str, Any] | None:
        if section is None:
            return None
        if isinstance(section, Mapping):
            return dict(section)
        return dict(section.model_dump())

    return raw(keystore), raw(audit)


def _store_url(store: str | None, config: Path | None) -> str:
    if store:
        return store
    keystore, audit = _config_sections(config)
    for section in (keystore, audit):
        if section and section.get("store"):
            return str(section["store"])
    if config is not None:
        return "sqlite:///var/lib/sovereign-gateway/audit.db"  # the audit log's default
    raise _fail("no key store given", "config_error",
                hint="pass --store URL (or SG_KEYSTORE_URL) or --config FILE")


@contextlib.asynccontextmanager
async def _audit_sink(
    config: Path | None, no_audit: bool
) -> AsyncIterator[Callable[[Mapping[str, Any]], Awaitable[Any]] | None]:
    if no_audit:
        warn("gateway", "unaudited", "--no-audit: this change is NOT audited")
        yield None
        return
    _, audit = _config_sections(config)
    if not audit or audit.get("enabled", True) is False:
        raise _fail("key changes must be audited", "config_error",
                    hint="pass --config FILE with an audit: section (or --no-audit to change "
                    "keys without an audit record)")
    from gateway.audit import AuditLog, AuditSettings

    base = AuditSettings.model_validate(audit)
    host = socket.gethostname().split(".")[0] or "host"
    replica = f"{base.replica_id}.keys-cli"[:63] if base.replica_id else f"{host}.keys-cli"
    log = AuditLog.from_settings(base.model_copy(update={"replica_id": replica}))
    await log.start()
    try:
        yield log.append
    finally:
        await log.close()


def _actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid{os.getuid()}"
    return f"{user}@{socket.gethostname()}"


def _run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    try:
        return asyncio.run(main())
    except KeystoreError as exc:
        raise _fail(exc.message, exc.code) from exc
    except Exception as exc:
        from gateway.audit import AuditError

        if isinstance(exc, AuditError):
            raise _fail(f"audit log unavailable, nothing changed: {exc}", exc.code) from exc
        raise


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key_json(key: ManagedKey, now_ms: int) -> dict[str, Any]:
    return {
        "id": key.id,
        "team": key.team,
        "models": list(key.models),
        "data_class": key.data_class,
        "description": key.description,
        "status": key.status(now_ms),
        "created_at": _iso(key.created_at),
        "expires_at": None if key.expires_at is None else _iso(key.expires_at),
        "revoked_at": None if key.revoked_at is None else _iso(key.revoked_at),
        "secrets": [
            {
                "created_at": _iso(s.created_at),
                "valid_until": _iso(s.valid_until) if s.valid_until else None,
            }
            for s in key.secrets
        ],
    }


def _print_issued(issued: IssuedKey, as_json: bool, verb: str) -> None:
    now_ms = issued.key.created_at
    if as_json:
        typer.echo(json.dumps({**_key_json(issued.key, now_ms), "key": issued.token}))
        return
    typer.echo(f"{verb} managed key {issued.key.id} (team {issued.key.team or '-'})")
    typer.echo(f"key:  {issued.token}")
    typer.echo("      (shown once: store it in your secret manager; only its SHA-256 is kept)")


async def _with_manager(
    store: str, config: Path | None, no_audit: bool, action: Callable[[KeyManager], Awaitable[T]]
) -> T:
    async with _audit_sink(config, no_audit) as sink:
        mgr = KeyManager(open_keystore(store), audit=sink, actor=_actor())
        try:
            return await action(mgr)
        finally:
            await mgr.store.close()


async def _read(store: str, action: Callable[[KeyManager], Awaitable[T]]) -> T:
    mgr = KeyManager(open_keystore(store), audit=None, actor=_actor())
    try:
        return await action(mgr)
    finally:
        await mgr.store.close()


@app.command("create")
def create(
    team: Annotated[
        str | None, typer.Option("--team", help="Team of the key (team quotas).")
    ] = None,
    models: Annotated[
        list[str] | None,
        typer.Option("--models", "--model", "-m", help="Allowed model (repeatable or a,b)."),
    ] = None,
    key_id: Annotated[str | None, typer.Option("--id", help="Key id (default key-<hex>).")] = None,
    expires: Annotated[str | None, typer.Option("--expires", help="Lifetime, e.g. 30d.")] = None,
    data_class: Annotated[str, typer.Option("--data-class", help="Data class.")] = "internal",
    description: Annotated[str, typer.Option("--description", help="Free text.")] = "",
    store: StoreOpt = None,
    config: ConfigOpt = None,
    no_audit: NoAuditOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Create a managed key and print it ONCE (only its SHA-256 is stored)."""
    names = [m.strip() for item in (models or []) for m in item.split(",") if m.strip()]
    if not names:
        raise typer.BadParameter("at least one --models NAME (or '*') is required")
    lifetime = parse_duration(expires) if expires else None
    url = _store_url(store, config)
    issued = _run(
        _with_manager(
            url,
            config,
            no_audit,
            lambda m: m.create(
                team=team,
                models=names,
                key_id=key_id,
                expires_in_s=lifetime,
                data_class=data_class,
                description=description,
            ),
        )
    )
    _print_issued(issued, as_json, "created")


@app.command("list")
def list_keys(
    store: StoreOpt = None,
    config: ConfigOpt = None,
    show_all: Annotated[bool, typer.Option("--all", help="Include revoked/expired keys.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """List managed keys (never the keys themselves)."""
    url = _store_url(store, config)
    keys = _run(_read(url, lambda m: m.list()))
    now_ms = int(dt.datetime.now(tz=dt.UTC).timestamp() * 1000)
    rows = [k for k in keys if show_all or k.usable_at(now_ms)]
    if as_json:
        typer.echo(json.dumps([_key_json(k, now_ms) for k in rows]))
        return
    if not rows:
        typer.echo("no managed keys")
        return
    typer.echo(f"{'ID':24} {'TEAM':16} {'STATUS':9} {'EXPIRES':20} MODELS")
    for k in rows:
        typer.echo(
            f"{k.id:24} {(k.team or '-'):16} {k.status(now_ms):9} "
            f"{_iso(k.expires_at):20} {','.join(k.models)}"
        )


@app.command("revoke")
def revoke(
    key_id: Annotated[str, typer.Argument(help="Id of the key to revoke.")],
    store: StoreOpt = None,
    config: ConfigOpt = None,
    no_audit: NoAuditOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Revoke a key: every replica refuses it within its keystore.refresh_s."""
    url = _store_url(store, config)
    key = _run(_with_manager(url, config, no_audit, lambda m: m.revoke(key_id)))
    if as_json:
        typer.echo(json.dumps(_key_json(key, key.revoked_at or 0)))
    else:
        typer.echo(f"revoked managed key {key.id} at {_iso(key.revoked_at)}")


@app.command("rotate")
def rotate(
    key_id: Annotated[str, typer.Argument(help="Id of the key to rotate.")],
    grace: Annotated[str, typer.Option("--grace", help="Old key stays valid this long.")] = "1h",
    store: StoreOpt = None,
    config: ConfigOpt = None,
    no_audit: NoAuditOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Issue a new key for the same id; the old one stays valid for --grace."""
    grace_s = 0.0 if grace.strip() in ("0", "0s") else parse_duration(grace)
    url = _store_url(store, config)
    issued = _run(_with_manager(url, config, no_audit, lambda m: m.rotate(key_id, grace_s=grace_s)))
    _print_issued(issued, as_json, "rotated")
    if not as_json:
        old = [s for s in issued.key.secrets if s.valid_until is not None]
        if old:
            typer.echo(f"      the previous key stays valid until {_iso(old[0].valid_until)}")


def main(argv: list[str] | None = None) -> int:
    """Run this group alone (``python -m gateway.cli.keys_managed``); returns the exit code."""
    return run(app, argv, prog="gateway keys")


if __name__ == "__main__":
    sys.exit(main())
