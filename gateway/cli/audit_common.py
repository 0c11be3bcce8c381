"""What the ``gateway audit`` commands share: the store, config and key options, and the way
from them to a store URL, the audit settings and the verifier keys; one error line for what
goes wrong on that way (exit 2; a bad proof exits 1)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import yaml
from pydantic import ValidationError

from clishell import EXIT_USAGE, CliError, existing_public_key, public_key_path, read_input_text
from gateway.audit import (
    AuditConfigError,
    AuditError,
    AuditSettings,
    ProofError,
    Verifier,
    load_verifier,
)

T = TypeVar("T")

StoreOpt = Annotated[
    str | None,
    typer.Option("--store", envvar="SG_AUDIT_STORE", help="sqlite:///PATH or postgresql://..."),
]
PublicKeyOpt = Annotated[
    list[Path] | None,
    typer.Option("--public-key", help="Verifier key file (KEY.pub from keygen); repeatable."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def fail(exc: BaseException, exit_code: int = EXIT_USAGE) -> CliError:
    """``exc`` as the one error line of the CLI boundary (``config_error`` for a YAML or
    validation error of ``--config``)."""
    code, hint = getattr(exc, "code", None), getattr(exc, "hint", None)
    return CliError(code if isinstance(code, str) else "config_error", str(exc),
                    hint=hint if isinstance(hint, str) else None, exit_code=exit_code)


def run_async(ctx: typer.Context, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; an AuditError becomes a CliError (exit 2; a bad proof exits 1)."""
    try:
        return asyncio.run(coro)
    except ProofError as exc:
        raise fail(exc, 1) from exc
    except AuditError as exc:
        raise fail(exc) from exc


def load_verifiers(ctx: typer.Context, paths: list[Path] | None) -> list[Verifier]:
    """The verifier keys in ``paths`` (``KEY.pub``; the old ``KEY.pub.pem`` too).

    Raises:
        CliError: A key cannot be read or parsed (exit 2).
    """
    try:
        return [load_verifier(existing_public_key(p, "gateway")) for p in paths or []]
    except AuditError as exc:
        raise fail(exc) from exc


def audit_settings(ctx: typer.Context, config: Path | None) -> AuditSettings | None:
    """The ``audit:`` section of the gateway config ``config`` (paths resolved next to it), or
    ``None`` without ``--config``.

    Raises:
        CliError: The file cannot be read, is not YAML, has no valid ``audit:`` section.
    """
    if config is None:
        return None
    try:
        try:
            text = read_input_text(config)
        except OSError as exc:
            raise AuditConfigError(f"cannot read config file {config}: {exc.strerror}") from exc
        doc = yaml.safe_load(text)
        section = doc.get("audit") if isinstance(doc, dict) else None
        if not isinstance(section, dict):
            raise AuditConfigError(f"{config} has no audit: section")
        # Relative paths (key files, checkpoint_dir, a sqlite:// file) are next to the config,
        # as for `gateway serve`, not in the working directory.
        return AuditSettings.model_validate(section).under(config.parent)
    except (OSError, yaml.YAMLError, ValidationError, AuditError) as exc:
        raise fail(exc) from exc


def config_public_key(signing_key: Path, config: Path | None) -> Path:
    """The public key of the config's signing key (``KEY.pub``; the old ``KEY.pub.pem`` too).

    Raises:
        CliError: Neither exists (exit 2), naming the file looked for.
    """
    pub = public_key_path(signing_key)
    found = existing_public_key(pub, "gateway")
    if found.is_file():
        return found
    raise CliError("key_missing", f"{config} names audit.signing_key_file {signing_key}, but its "
                   f"public key {pub} is not there: signatures cannot be checked",
                   hint="copy KEY.pub from where 'gateway audit keygen' wrote it, or pass "
                        "--public-key FILE")


def store_url(ctx: typer.Context, store: str | None, config: Path | None) -> str:
    """``--store``, else the store of ``--config``'s audit section."""
    if store:
        return store
    settings = audit_settings(ctx, config)
    if settings is None:
        raise fail(AuditConfigError("give --store URL (or SG_AUDIT_STORE) or --config FILE"))
    try:
        return settings.store_url()
    except AuditError as exc:
        raise fail(exc) from exc
