"""``gateway audit export``, ``timeline`` and ``tail``: reading the log's records out.

Registered on the audit app by :mod:`gateway.cli.audit`. ``export`` writes the records of a
time range (or of one data subject) as JSON lines, or one AI Act document with completeness
proofs; ``timeline`` links an agent session's model and tool calls by trace id; ``tail`` shows
the newest records and follows new ones. Exit 0 ok, 2 usage or I/O error.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from clishell import CliError, ConfigOpt, Interrupted, atomic_file, shown, write_atomic
from gateway.audit import AuditConfigError, AuditError, export_records, open_store, tail_records
from gateway.audit.pseudonym import PREFIX as PSEUDONYM_PREFIX
from gateway.audit.pseudonym import load_pseudonymizer
from gateway.audit.query import subject_records
from gateway.audit.records import Record
from gateway.cli.audit_common import JsonOpt, StoreOpt, audit_settings, fail, run_async, store_url


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
    keys = ("request_id", "key_id", "model", "server", "mcp_method", "tool", "destination",
            "decision", "status", "outcome")
    # model, tool (and, for /v1/models/{id}, path) are what a client sent: never raw on a
    # terminal.
    fields = " ".join(f"{k}={shown(data[k])}" for k in keys if k in data)
    # chain and type are columns anyone who can write to the store controls.
    return f"{when} {shown(rec.chain)}#{rec.seq} {shown(rec.type)} {fields}".rstrip()


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
    url = store_url(ctx, store, config)
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

    n = run_async(ctx, go())
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

    doc = run_async(ctx, go())
    text = json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if out is None:
        sys.stdout.write(text)
        return
    try:
        write_atomic(out, text)
    except OSError as exc:
        raise AuditError(f"cannot write {out}: {exc.strerror}") from exc
    typer.echo(f"exported {len(doc['events'])} events to {out}", err=True)


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
        settings = audit_settings(ctx, config)
        if settings is None:
            raise fail(AuditConfigError("--issuer needs the pseudonym key: give "
                                         "--pseudonym-key FILE or --config FILE"))
        key_file = settings.pseudonym_key_file
    try:
        pseudo = load_pseudonymizer(key_file)
    except AuditError as exc:
        raise fail(exc) from exc
    # Here, not at import: the identity checks bring PyJWT and httpx to every ``gateway``
    # command (``serve`` too, which imports this command group).
    from gateway.identity.auth import subject_pseudonym

    return subject_pseudonym(pseudo, issuer, subject)


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

    url = store_url(ctx, store, config)
    since_us = _parse_time(since, "--since")

    async def go() -> list[Any]:
        st = open_store(url, read_only=True)
        await st.open()
        try:
            records = [rec async for rec in export_records(st, since_us, None)]
        finally:
            await st.close()
        return session_timeline(records, trace_id=trace_id, key_id=key)

    entries = run_async(ctx, go())
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
    url = store_url(ctx, store, config)

    async def go() -> None:
        st = open_store(url, read_only=True)
        await st.open()
        try:
            async for rec in tail_records(st, last=lines, follow=follow):
                typer.echo(_line(rec, as_json))
        finally:
            await st.close()

    # Ctrl-C / SIGTERM while following: the boundary's Interrupted (exit 130 / 143), the
    # store closed on the way out (asyncio.run cancels go(): its finally runs). The default
    # error line ("nothing half-written ...; rerun the command to resume") is about commands
    # that write: tail only reads.
    try:
        run_async(ctx, go())
    except Interrupted as exc:
        raise Interrupted(exc.signum, f"interrupted by {exc.name}; stopped reading the log "
                          "(read only: nothing was written)",
                          hint="a signal is how -f ends; the exit status names it") from None
