"""``gateway audit ...``: verify, export, tail, timeline, prove, verify-proof, keygen.

Registered by the gateway CLI as a sub-app (``app.add_typer(audit.app, name="audit")``); also
runnable alone as ``python -m gateway.cli.audit``. Exit codes: 0 ok, 1 verification failed
(tampering or an invalid proof), 2 usage or I/O error (store unreachable, unreadable key).
The store URL comes from ``--store`` or ``SG_AUDIT_STORE``, or from the ``audit:`` section of the
gateway config given with ``--config`` (which also supplies ``verify``'s checkpoint directory).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import yaml
from pydantic import ValidationError

from clishell import (
    EXIT_USAGE,
    CliError,
    ConfigOpt,
    atomic_file,
    existing_public_key,
    public_key_path,
    read_input_text,
    run,
    shown,
    write_atomic,
)
from gateway.audit import (
    AuditConfigError,
    AuditError,
    AuditSettings,
    ProofError,
    Signer,
    Verifier,
    export_records,
    generate_key_file,
    load_verifier,
    open_store,
    prove,
    tail_records,
    verify_proof_report,
    verify_store,
    write_key_pair,
)
from gateway.audit.checkpoint import DEFAULT_KEY_NAME
from gateway.audit.pseudonym import PREFIX as PSEUDONYM_PREFIX
from gateway.audit.pseudonym import load_pseudonymizer
from gateway.audit.query import subject_records
from gateway.audit.records import Record
from gateway.audit.verify import VerifyReport
from gateway.identity.auth import subject_pseudonym

T = TypeVar("T")

app = typer.Typer(
    help="Tamper-evident audit log: verify, export, tail, prove.", no_args_is_help=True
)

StoreOpt = Annotated[
    str | None,
    typer.Option("--store", envvar="SG_AUDIT_STORE", help="sqlite:///PATH or postgresql://..."),
]
PublicKeyOpt = Annotated[
    list[Path] | None,
    typer.Option("--public-key", help="Verifier key file (KEY.pub from keygen); repeatable."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _fail(exc: BaseException, exit_code: int = EXIT_USAGE) -> CliError:
    """``exc`` as the one error line of the CLI boundary (``config_error`` for a YAML or
    validation error of ``--config``)."""
    code, hint = getattr(exc, "code", None), getattr(exc, "hint", None)
    return CliError(code if isinstance(code, str) else "config_error", str(exc),
                    hint=hint if isinstance(hint, str) else None, exit_code=exit_code)


def _run(ctx: typer.Context, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; an AuditError becomes a CliError (exit 2; a bad proof exits 1)."""
    try:
        return asyncio.run(coro)
    except ProofError as exc:
        raise _fail(exc, 1) from exc
    except AuditError as exc:
        raise _fail(exc) from exc


def _verifiers(ctx: typer.Context, paths: list[Path] | None) -> list[Verifier]:
    try:
        return [load_verifier(existing_public_key(p, "gateway")) for p in paths or []]
    except AuditError as exc:
        raise _fail(exc) from exc


def _audit_settings(ctx: typer.Context, config: Path | None) -> AuditSettings | None:
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
        raise _fail(exc) from exc


def _config_public_key(signing_key: Path, config: Path | None) -> Path:
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


def _store_url(ctx: typer.Context, store: str | None, config: Path | None) -> str:
    """``--store``, else the store of ``--config``'s audit section."""
    if store:
        return store
    settings = _audit_settings(ctx, config)
    if settings is None:
        raise _fail(AuditConfigError("give --store URL (or SG_AUDIT_STORE) or --config FILE"))
    try:
        return settings.store_url()
    except AuditError as exc:
        raise _fail(exc) from exc


@app.callback()
def _root() -> None:
    """Tamper-evident audit log: verify, export, tail, prove."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _render_report(report: VerifyReport) -> None:
    n = sum(c.records for c in report.chains)
    typer.echo(f"store {report.store}: {len(report.chains)} chain(s), {n} record(s)")
    for c in report.chains:
        state = "closed" if c.closed else "open"
        typer.echo(
            f"  {c.chain}: {c.records} records, sealed {c.sealed_size}, "
            f"{c.checkpoints} checkpoints, {state}"
        )
    for f in report.findings:
        typer.echo(f"  {f}")
    typer.echo("OK: no tampering found" if report.ok else f"FAILED: {len(report.errors)} error(s)")


@app.command()
def verify(
    ctx: typer.Context,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    public_key: PublicKeyOpt = None,
    checkpoints: Annotated[
        Path | None, typer.Option("--checkpoints", help="Directory of exported checkpoints.")
    ] = None,
    max_gap_s: Annotated[
        float | None, typer.Option(help="Largest allowed gap between records, seconds.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Recompute every record hash, chain link, checkpoint root and signature.

    With --config and no --public-key, signatures are checked with the public key of the
    config's audit.signing_key_file (KEY.pub next to it); a missing one is an error, not a
    silent "signatures unchecked".
    """
    url = _store_url(ctx, store, config)
    settings = _audit_settings(ctx, config)
    if not public_key and settings is not None:
        public_key = [_config_public_key(settings.signing_key_file, config)]
    verifiers = _verifiers(ctx, public_key)
    if checkpoints is None:
        checkpoints = settings.checkpoint_dir if settings else None

    async def go() -> VerifyReport:
        st = open_store(url, read_only=True)
        await st.open()
        try:
            return await verify_store(
                st, verifiers=verifiers, checkpoint_dir=checkpoints, max_gap_s=max_gap_s
            )
        finally:
            await st.close()

    report = _run(ctx, go())
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        _render_report(report)
    raise typer.Exit(0 if report.ok else 1)


def _parse_time(value: str | None, name: str) -> int | None:
    if value is None:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError as exc:
        raise typer.BadParameter(f"{value!r} is not an ISO 8601 time", param_hint=name) from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1_000_000)


def _line(rec: Record, as_json: bool) -> str:
    if as_json:
        return rec.body.decode("utf-8")
    data = rec.decoded()["data"]
    when = datetime.fromtimestamp(rec.ts_us / 1e6, UTC).isoformat(timespec="milliseconds")
    keys = ("request_id", "key_id", "model", "destination", "decision", "status", "outcome")
    # model (and, for /v1/models/{id}, path) are what a client sent: never raw on a terminal.
    fields = " ".join(f"{k}={shown(data[k])}" for k in keys if k in data)
    return f"{when} {rec.chain}#{rec.seq} {rec.type} {fields}".rstrip()


@app.command()
def export(
    ctx: typer.Context,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    since: Annotated[str | None, typer.Option(help="ISO 8601 start (inclusive, UTC).")] = None,
    until: Annotated[str | None, typer.Option(help="ISO 8601 end (exclusive, UTC).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="Output format: jsonl (the records), "
                                     "ai-act (one JSON document: events mapped to AI Act "
                                     "Art. 12(2), with completeness proofs).")] = "jsonl",
    out: Annotated[Path | None, typer.Option(help="Write here instead of stdout.")] = None,
    subject: Annotated[str | None, typer.Option(
        "--subject", help="Only this data subject's records: its pseudonym "
        "(hmac-sha256:...), or ISSUER SUBJECT with --issuer (needs the pseudonym key).")] = None,
    issuer: Annotated[str | None, typer.Option(
        "--issuer", help="The token issuer of --subject (then --subject is the plain subject "
        "claim, pseudonymised with the pseudonym key; 'mtls' for client certificates).")] = None,
    pseudonym_key: Annotated[Path | None, typer.Option(
        "--pseudonym-key", help="Pseudonym key file (default: --config's "
        "audit.pseudonym_key_file).")] = None,
) -> None:
    """Export records in a time range as JSON lines (the canonical record bytes), or as one
    AI Act log document with its completeness proofs (--format ai-act).

    With --subject: only one person's or workload's records (a data-subject access request):
    the requests whose verified identity is that subject, with their completion records.
    """
    if fmt not in ("jsonl", "ai-act"):
        raise typer.BadParameter("jsonl or ai-act", param_hint="--format")
    if fmt == "ai-act" and subject is not None:
        # The ai-act export proves completeness over whole chains; a subject's records are a
        # selection of them (a data-subject access request is exported as jsonl).
        raise typer.BadParameter("--subject works with --format jsonl", param_hint="--subject")
    wanted = _subject_pseudonym(ctx, subject, issuer, pseudonym_key, config)
    since_us, until_us = _parse_time(since, "--since"), _parse_time(until, "--until")
    if since_us is not None and until_us is not None and since_us >= until_us:
        raise CliError("usage_error", f"--since {since} is not before --until {until}: the "
                       "window holds no record", hint="--since is inclusive, --until exclusive")
    url = _store_url(ctx, store, config)
    if fmt == "ai-act":
        _export_ai_act(ctx, url, since_us, until_us, out)
        return

    async def go() -> int:
        st = open_store(url, read_only=True)
        await st.open()
        n = 0
        try:
            # --out: the file appears complete or not at all (interrupted, disk full)
            with atomic_file(out) if out else _stdout() as fh:
                records = export_records(st, since_us, until_us)
                if wanted is not None:
                    records = subject_records(records, wanted)
                async for rec in records:
                    fh.write(rec.body.decode("utf-8") + "\n")
                    n += 1
        except BrokenPipeError:
            raise  # the reader went away (`| head`): main() ends quietly
        except OSError as exc:
            raise AuditError(f"cannot write {out or 'stdout'}: {exc.strerror}") from exc
        finally:
            await st.close()
        return n

    n = _run(ctx, go())
    if out:
        typer.echo(f"exported {n} records to {out}", err=True)


def _export_ai_act(ctx: typer.Context, url: str, since_us: int | None, until_us: int | None,
                   out: Path | None) -> None:
    from gateway.audit.ai_act import export_ai_act

    async def go() -> dict[str, Any]:
        st = open_store(url, read_only=True)
        await st.open()
        try:
            now_us = int(datetime.now(UTC).timestamp() * 1_000_000)
            return await export_ai_act(st, since_us, until_us, now_us)
        finally:
            await st.close()

    doc = _run(ctx, go())
    text = json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if out is None:
        sys.stdout.write(text)
        return
    try:
        write_atomic(out, text)
    except OSError as exc:
        raise AuditError(f"cannot write {out}: {exc.strerror}") from exc
    typer.echo(f"exported {len(doc['events'])} events to {out}", err=True)


@app.command("verify-export")
def verify_export_cmd(
    ctx: typer.Context,
    export_file: Annotated[Path, typer.Argument(help="An ai-act export (JSON).")],
    public_key: PublicKeyOpt = None,
) -> None:
    """Verify an ai-act export offline: signed checkpoints, inclusion, no record left out."""
    from gateway.audit.ai_act import verify_export

    if not public_key:
        raise typer.BadParameter("the audit verifier key is needed", param_hint="--public-key")
    verifiers = _verifiers(ctx, public_key)
    try:
        doc = json.loads(read_input_text(export_file))
    except (OSError, ValueError) as exc:
        raise _fail(exc) from exc
    try:
        n = verify_export(doc, verifiers)
    except ProofError as exc:
        typer.echo(f"FAILED: {exc}", err=True)
        raise typer.Exit(1) from None
    except AuditError as exc:  # malformed: not an export
        raise _fail(exc) from exc
    typer.echo(f"OK: {n} events, every chain's range complete and signed")
    unsealed = sum(int(c.get("unsealed_excluded") or 0) for c in doc.get("completeness") or ())
    if unsealed:  # stated by the exporter, not proven: export again after the next checkpoint
        typer.echo(f"note: the exporter left out {unsealed} records not sealed yet", err=True)


def _subject_pseudonym(ctx: typer.Context, subject: str | None, issuer: str | None,
                       key_file: Path | None, config: Path | None) -> str | None:
    """The pseudonym to filter on: ``--subject`` as given, or (with ``--issuer``) the plain
    subject pseudonymised with the pseudonym key, as the gateway recorded it."""
    if subject is None:
        if issuer is not None:
            raise typer.BadParameter("--issuer needs --subject", param_hint="--issuer")
        return None
    if issuer is None:
        if not subject.startswith(PSEUDONYM_PREFIX):
            raise typer.BadParameter(
                f"give the pseudonym ({PSEUDONYM_PREFIX}...), or the subject with --issuer",
                param_hint="--subject")
        return subject
    if key_file is None:
        settings = _audit_settings(ctx, config)
        if settings is None:
            raise _fail(AuditConfigError("--issuer needs the pseudonym key: give "
                                         "--pseudonym-key FILE or --config FILE"))
        key_file = settings.pseudonym_key_file
    try:
        pseudo = load_pseudonymizer(key_file)
    except AuditError as exc:
        raise _fail(exc) from exc
    return subject_pseudonym(pseudo, issuer, subject)


@app.command()
def timeline(
    ctx: typer.Context,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    trace_id: Annotated[str | None, typer.Option(
        "--trace-id", help="The W3C trace id (32 hex) of the agent session.")] = None,
    key: Annotated[str | None, typer.Option("--key", help="Only this key id.")] = None,
    since: Annotated[str | None, typer.Option(help="ISO 8601 start (inclusive, UTC).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per step.")] = False,
) -> None:
    """An agent session as one timeline: model calls and MCP tool calls linked by trace id."""
    if trace_id is None and key is None:
        raise typer.BadParameter("give --trace-id or --key", param_hint="--trace-id")
    if trace_id is not None and (len(trace_id) != 32
                                 or not set(trace_id) <= set("0123456789abcdef")):
        raise typer.BadParameter(f"{trace_id!r} is not a trace id (32 lowercase hex digits, the "
                                 "second field of a W3C traceparent)", param_hint="--trace-id")
    from gateway.audit.timeline import session_timeline

    url = _store_url(ctx, store, config)
    since_us = _parse_time(since, "--since")

    async def go() -> list[Any]:
        st = open_store(url, read_only=True)
        await st.open()
        try:
            records = [rec async for rec in export_records(st, since_us, None)]
        finally:
            await st.close()
        return session_timeline(records, trace_id=trace_id, key_id=key)

    entries = _run(ctx, go())
    callers = sorted({e.key_id for e in entries if e.key_id is not None})
    if key is None and len(callers) > 1:
        # The client chooses its trace id: a second caller can reuse one it has seen.
        typer.echo(f"note: trace {trace_id} holds the steps of {len(callers)} callers "
                   f"({', '.join(callers)}); a trace id is chosen by the client, so another "
                   "caller can reuse it: add --key KEY_ID for one caller's steps", err=True)
    for entry in entries:
        if as_json:
            typer.echo(json.dumps(entry.as_dict(), sort_keys=True))
            continue
        when = datetime.fromtimestamp(entry.ts_us / 1e6, UTC).isoformat(timespec="milliseconds")
        typer.echo(f"{when} {entry.kind:<5} {shown(entry.key_id)} {shown(entry.what)} "
                   f"{entry.decision} {entry.status} {shown(entry.detail)} "
                   f"trace={entry.trace_id} {entry.ref}".rstrip())


class _stdout:
    def __enter__(self) -> Any:
        return sys.stdout

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()


@app.command()
def tail(
    ctx: typer.Context,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    lines: Annotated[int, typer.Option("-n", "--lines", min=0,
                                       help="Records to show first.")] = 10,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new ones.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show the newest records (and follow new ones with -f)."""
    url = _store_url(ctx, store, config)

    async def go() -> None:
        st = open_store(url, read_only=True)
        await st.open()
        try:
            async for rec in tail_records(st, last=lines, follow=follow):
                typer.echo(_line(rec, as_json))
        finally:
            await st.close()

    # Ctrl-C / SIGTERM while following: the boundary's Interrupted (exit 130 / 143), the
    # store closed on the way out (asyncio.run cancels go(): its finally runs).
    _run(ctx, go())


@app.command("prove")
def prove_cmd(
    ctx: typer.Context,
    request_id: str,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    out: Annotated[Path | None, typer.Option(help="Write the bundle here.")] = None,
) -> None:
    """Print the records of REQUEST_ID with Merkle inclusion proofs (JSON bundle)."""
    url = _store_url(ctx, store, config)

    async def go() -> dict[str, Any]:
        st = open_store(url, read_only=True)
        await st.open()
        try:
            return await prove(st, request_id)
        finally:
            await st.close()

    bundle = _run(ctx, go())
    for warning in bundle.get("warnings", []):
        typer.echo(f"warning: {warning}", err=True)
    text = json.dumps(bundle, indent=2, ensure_ascii=False) + "\n"
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        write_atomic(out, text)
    except OSError as exc:  # named by the file asked for, not write_atomic's temporary file
        raise CliError("io_error", f"cannot write the proof bundle to {out}: "
                       f"{exc.strerror or exc}") from exc


@app.command("verify-proof")
def verify_proof_cmd(
    ctx: typer.Context,
    bundle: Annotated[Path, typer.Argument(help="Proof bundle from `gateway audit prove`.")],
    public_key: PublicKeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Check a proof bundle offline with the public key alone.

    Prints the record types proved per request and a 'warning:' line (exit 0) when a
    request's request.started / request.completed pair is incomplete.
    """
    verifiers = _verifiers(ctx, public_key)
    if not verifiers:
        raise _fail(AuditError("--public-key is required"))
    try:
        data = json.loads(bundle.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError("io_error", f"cannot read proof bundle {bundle}: "
                       f"{exc.strerror or exc}") from exc
    except ValueError as exc:  # not JSON, or not UTF-8
        raise CliError("audit_format", f"{bundle} is not a proof bundle (not JSON: {exc})",
                       hint="give the file `gateway audit prove --out FILE` wrote") from exc
    try:
        report = verify_proof_report(data, verifiers)
    except AuditError as exc:  # one error line; with --json the shell's one JSON document
        raise _fail(exc, 1) from exc
    if as_json:
        doc = {"ok": True, "records": report.records, "types": report.types,
               "warnings": report.warnings}
        typer.echo(json.dumps(doc, ensure_ascii=False))
        return
    by_request: dict[str, list[str]] = {}
    for rec in report.records:
        typer.echo(f"OK {rec['chain']}#{rec['seq']} {rec['type']} is in the signed log")
        rid = str((rec.get("data") or {}).get("request_id"))
        by_request.setdefault(rid, []).append(str(rec["type"]))
    for rid, types in by_request.items():
        typer.echo(f"request {rid}: proved {', '.join(types)}")
    for warning in report.warnings:
        typer.echo(f"warning: {warning}")


@app.command()
def keygen(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Private key file (OUT.pub gets the public key).")],
    name: Annotated[str, typer.Option(help="Signed-note key name.")] = DEFAULT_KEY_NAME,
    pseudonym_key: Annotated[
        Path | None, typer.Option(help="Also create a pseudonymisation HMAC key here.")
    ] = None,
) -> None:
    """Create the Ed25519 checkpoint signing key (mode 0600) and its public key."""
    try:
        priv, pub = write_key_pair(Signer.generate(name), out)
        typer.echo(f"signing key: {priv}\npublic key:  {pub}")
        if pseudonym_key is not None:
            typer.echo(f"pseudonym key: {generate_key_file(pseudonym_key)}")
    except AuditError as exc:
        raise _fail(exc) from exc


def main() -> int:
    """Entry point for ``python -m gateway.cli.audit``; returns the exit status."""
    return run(app, None, prog="gateway audit")


if __name__ == "__main__":
    sys.exit(main())
