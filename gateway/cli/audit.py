"""``gateway audit ...``: verify, export, tail, timeline, prove, verify-proof, keygen.

Registered by the gateway CLI as a sub-app (``app.add_typer(audit.app, name="audit")``); also
runnable alone as ``python -m gateway.cli.audit``. Exit codes: 0 ok, 1 verification failed
(tampering or an invalid proof), 2 usage or I/O error (store unreachable, unreadable key).
The store URL comes from ``--store`` or ``SG_AUDIT_STORE``, or from the ``audit:`` section of the
gateway config given with ``--config`` (which also supplies ``verify``'s checkpoint directory).

The commands that read records out (``export``, ``timeline``, ``tail``) are in
:mod:`gateway.cli.audit_read`; the options and the way to a store, in
:mod:`gateway.cli.audit_common`. Here: the app, and verifying, proving and keys.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from clishell import CliError, ConfigOpt, read_input_text, run, shown, write_atomic
from gateway.audit import (
    AuditError,
    ProofError,
    Signer,
    VerifyReport,
    generate_key_file,
    open_store,
    prove,
    verify_proof_report,
    verify_store,
    write_key_pair,
)
from gateway.audit.checkpoint import DEFAULT_KEY_NAME
from gateway.cli.audit_common import (
    JsonOpt,
    PublicKeyOpt,
    StoreOpt,
    audit_settings,
    config_public_key,
    fail,
    load_verifiers,
    run_async,
    store_url,
)
from gateway.cli.audit_read import export, tail, timeline

app = typer.Typer(
    help="Tamper-evident audit log: verify, export, tail, prove.", no_args_is_help=True
)


@app.callback()
def _root() -> None:
    """Tamper-evident audit log: verify, export, tail, prove."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def _render_report(report: VerifyReport) -> None:
    """Print the report; every value read from the store is escaped (:func:`shown`): a chain
    id or message holding CR, LF or an escape sequence cannot forge or overwrite a line."""
    n = sum(c.records for c in report.chains)
    typer.echo(f"store {shown(report.store)}: {len(report.chains)} chain(s), {n} record(s)")
    for c in report.chains:
        state = "closed" if c.closed else "open"
        typer.echo(
            f"  {shown(c.chain)}: {c.records} records, sealed {c.sealed_size}, "
            f"{c.checkpoints} checkpoints, {state}"
        )
    for f in report.findings:
        where = "-" if f.chain is None else shown(f.chain)
        if f.seq is not None:
            where += f" seq {f.seq}"
        typer.echo(f"  {f.severity.upper()} {f.code} [{where}]: {shown(f.message)}")
    if not report.ok:
        typer.echo(f"FAILED: {len(report.errors)} error(s)")
    elif report.accepted_unsealed:
        typer.echo(f"OK: no tampering found; {len(report.accepted_unsealed)} chain(s) accepted "
                   "unauthenticated (--allow-unsealed): "
                   f"{', '.join(shown(c) for c in report.accepted_unsealed)}")
    else:
        typer.echo("OK: no tampering found")


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
    allow_unsealed: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-unsealed",
            metavar="CHAIN",
            help="Accept this chain although no record of it is covered by a trusted "
            "checkpoint (its records are then unauthenticated); repeatable.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Recompute every record hash, chain link, checkpoint root and signature.

    A chain none of whose records is covered by a checkpoint signed by a trusted key fails
    (unauthenticated_chain): anyone who can write to the store can add one. Name it with
    --allow-unsealed CHAIN to accept it; the OK line then names the chains accepted.

    With --config and no --public-key, signatures are checked with the public key of the
    config's audit.signing_key_file (KEY.pub next to it); a missing one is an error, not a
    silent "signatures unchecked".

    With --store and neither --public-key nor --config, no key is trusted and no signature
    is checked: OK then means the log is consistent with itself, not that your key signed
    it (warning signatures_not_checked).
    """
    url = store_url(ctx, store, config)
    settings = audit_settings(ctx, config)
    if not public_key and settings is not None:
        public_key = [config_public_key(settings.signing_key_file, config)]
    verifiers = load_verifiers(ctx, public_key)
    if checkpoints is None:
        checkpoints = settings.checkpoint_dir if settings else None

    async def go() -> VerifyReport:
        st = open_store(url, read_only=True)
        await st.open()
        try:
            return await verify_store(
                st,
                verifiers=verifiers,
                checkpoint_dir=checkpoints,
                max_gap_s=max_gap_s,
                allow_unsealed=frozenset(allow_unsealed or ()),
            )
        finally:
            await st.close()

    report = run_async(ctx, go())
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        _render_report(report)
    raise typer.Exit(0 if report.ok else 1)


app.command()(export)


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
    verifiers = load_verifiers(ctx, public_key)
    try:
        doc = json.loads(read_input_text(export_file))
    except (OSError, ValueError) as exc:
        raise fail(exc) from exc
    try:
        n = verify_export(doc, verifiers)
    except ProofError as exc:
        typer.echo(f"FAILED: {exc}", err=True)
        raise typer.Exit(1) from None
    except AuditError as exc:  # malformed: not an export
        raise fail(exc) from exc
    typer.echo(f"OK: {n} events, every chain's range complete and signed")
    unsealed = sum(int(c.get("unsealed_excluded") or 0) for c in doc.get("completeness") or ())
    if unsealed:  # stated by the exporter, not proven: export again after the next checkpoint
        typer.echo(f"note: the exporter left out {unsealed} records not sealed yet", err=True)


app.command()(timeline)
app.command()(tail)


@app.command("prove")
def prove_cmd(
    ctx: typer.Context,
    request_id: str,
    store: StoreOpt = None,
    config: ConfigOpt = None,
    out: Annotated[Path | None, typer.Option(help="Write the bundle here.")] = None,
) -> None:
    """Print the records of REQUEST_ID with Merkle inclusion proofs (JSON bundle)."""
    url = store_url(ctx, store, config)

    async def go() -> dict[str, Any]:
        st = open_store(url, read_only=True)
        await st.open()
        try:
            return await prove(st, request_id)
        finally:
            await st.close()

    bundle = run_async(ctx, go())
    for warning in bundle.get("warnings", []):
        typer.echo(f"warning: {shown(warning)}", err=True)
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
    verifiers = load_verifiers(ctx, public_key)
    if not verifiers:
        raise fail(AuditError("--public-key is required"))
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
        raise fail(exc, 1) from exc
    if as_json:
        doc = {"ok": True, "records": report.records, "types": report.types,
               "warnings": report.warnings}
        typer.echo(json.dumps(doc, ensure_ascii=False))
        return
    by_request: dict[str, list[str]] = {}
    for rec in report.records:
        typer.echo(f"OK {shown(rec['chain'])}#{rec['seq']} {shown(rec['type'])} is in the "
                   "signed log")
        rid = str((rec.get("data") or {}).get("request_id"))
        by_request.setdefault(rid, []).append(str(rec["type"]))
    for rid, types in by_request.items():
        typer.echo(f"request {shown(rid)}: proved {shown(', '.join(types))}")
    for warning in report.warnings:
        typer.echo(f"warning: {shown(warning)}")


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
        raise fail(exc) from exc


def main() -> int:
    """Entry point for ``python -m gateway.cli.audit``; returns the exit status."""
    return run(app, None, prog="gateway audit")


if __name__ == "__main__":
    sys.exit(main())
