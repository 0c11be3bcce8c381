"""``gateway preflight``: run the sovereignty checks; ``gateway preflight verify DIR``.

``gateway preflight [inputs] [--out DIR --sign-key KEY] [--json]`` exits 0 (every required
check passed or was skipped), 1 (a required check failed), 2 (could not run: an input given
cannot be read). ``gateway preflight verify DIR --key PUB [--max-age 30d] [--allow-fail]
[--json]`` shows the pack's signed result and date and exits 0 (signature and every file
verify, the result is PASS and the pack is no older than --max-age), 1 (verification failed,
a FAIL pack, or a pack too old: ``gateway.preflight.acceptance``), 2 (not a pack, unreadable
key, a bad --max-age).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Annotated

import typer

from clishell import CliError, ConfigOpt, existing_public_key
from clishell.consoles import print_wrapped, results
from clishell.text import counted
from gateway.preflight.inputs import REGION_LABEL, Criteria, Inputs

__all__ = ["app"]

app = typer.Typer(help="Sovereignty pre-flight: prove 'in region, nothing leaves'.",
                  no_args_is_help=False, pretty_exceptions_enable=False)

_Opt = typer.Option
PathOpt = Annotated[Path | None, _Opt(dir_okay=False)]


def _default_helm() -> Path | None:
    local = Path(".tools/bin/helm")
    if local.is_file():
        return local
    found = shutil.which("helm")
    return Path(found) if found else None


def _helm_for(values: list[Path] | None, helm: Path | None, chart: Path,
              release: str) -> Path | None:
    """The helm binary to render ``values`` with (None without values).

    Raises:
        CliError: Values given and no helm found: says where it looked and what to do instead.
    """
    if not values:
        return None
    _check_chart(chart)
    found = helm or _default_helm()
    if found is None:
        flags = " ".join(f"-f {v}" for v in values)
        raise CliError("preflight_input",
                       f"--values needs helm to render the chart {chart}, and no helm was "
                       "found (looked for .tools/bin/helm and helm on PATH)",
                       hint=f"install helm (make tools puts one in .tools/bin), pass --helm "
                            f"PATH, or render elsewhere: helm template {release} {chart} "
                            f"{flags} > manifests.yaml, then --manifests manifests.yaml")
    return found


def _check_chart(chart: Path) -> None:
    """Refuse a ``--chart`` that is not a chart directory before helm reads it as a repository.

    The chart is not part of the installed package (pyproject ships only the Python packages),
    so the default ``helm/sovereign-gateway`` is relative to the current directory: run from
    anywhere else, helm said ``Error: repo helm not found``, naming neither path nor option.

    Raises:
        CliError: ``preflight_input`` (exit 2) naming the directory looked for and ``--chart``.
    """
    if (chart / "Chart.yaml").is_file():
        return
    where = chart if chart.is_absolute() else f"{chart} (relative to {Path.cwd()})"
    raise CliError("preflight_input",
                   f"--values needs the chart, and {where} is not a chart directory "
                   "(no Chart.yaml there)",
                   hint="pass --chart <checkout>/helm/sovereign-gateway, or run from the "
                        "checkout; --manifests FILE checks manifests rendered elsewhere")


def _public_key(path: Path | None) -> Path | None:
    """A public key file as given, or its other name (KEY.pub / KEY.pub.pem) with a warning."""
    return None if path is None else existing_public_key(path, "gateway")


@app.callback(invoke_without_command=True)
def preflight(
    ctx: typer.Context,
    config: ConfigOpt = None,
    policy: Annotated[Path | None, _Opt(help="Egress policy (default: the config's).")] = None,
    values: Annotated[list[Path] | None, _Opt("--values", "-f", help="Helm values file "
                                              "(repeatable; rendered with helm template).")]
    = None,
    chart: Annotated[Path, _Opt(help="Chart directory (default: relative to the current "
                                "directory, i.e. run from the checkout).")]
    = Path("helm/sovereign-gateway"),
    helm: Annotated[Path | None, _Opt(help="helm binary (default: .tools/bin/helm if present, "
                                     "else helm on PATH).")] = None,
    manifests: Annotated[Path | None, _Opt(help="Rendered manifests (instead of values).")]
    = None,
    release: Annotated[str, _Opt(help="Helm release name.")] = "sg",
    namespace: Annotated[str, _Opt("--namespace", "-n", help="Release namespace.")] = "default",
    admin_url: Annotated[str | None, _Opt(help="Admin port of a running gateway "
                                          "(http://host:9090).")] = None,
    kubeconfig: Annotated[Path | None, _Opt(help="Kubeconfig (read-only API use).")] = None,
    kube_context: Annotated[str | None, _Opt(help="Kubeconfig context.")] = None,
    region: Annotated[list[str] | None, _Opt(help="Allowed region (repeatable).")] = None,
    jurisdiction: Annotated[list[str] | None, _Opt(help="Allowed jurisdiction (repeatable; "
                                                   "default EU).")] = None,
    registry: Annotated[list[str] | None, _Opt(help="In-region image registry prefix "
                                               "(repeatable).")] = None,
    retention_days: Annotated[int | None, _Opt(help="Declared audit log retention, days.")]
    = None,
    region_label: Annotated[str, _Opt(help="Node label carrying the region.")] = REGION_LABEL,
    audit_public_key: Annotated[Path | None, _Opt(help="Audit log verifier key.")] = None,
    require_identity: Annotated[bool, _Opt(
        "--require-identity", help="Callers must be identified by OIDC/JWT or mTLS "
        "(identity.configured fails without an identity: section).")] = False,
    lockfile: Annotated[Path | None, _Opt(help="weights.lock.")] = None,
    weights_dir: Annotated[Path | None, _Opt("--weights", help="Weights in use (directory or "
                                             "HF cache).")] = None,
    weights_signature: Annotated[Path | None, _Opt(help="model_signing signature.")] = None,
    weights_public_key: Annotated[Path | None, _Opt(help="Public key of that signature.")]
    = None,
    out: Annotated[Path | None, _Opt(help="Write the signed evidence pack here.")] = None,
    sign_key: Annotated[Path | None, _Opt(help="Operator's Ed25519 private key (PEM) for "
                                          "--out.")] = None,
    oscal: Annotated[Path | None, _Opt(help="Also write OSCAL 1.2.1 component definition and "
                                       "assessment results here (and into the --out pack).")]
    = None,
    as_json: Annotated[bool, _Opt("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run the pre-flight checks (inputs optional; checks without their input are skipped)."""
    if ctx.invoked_subcommand is not None:
        return
    # Imported here so that the other `gateway` commands start fast.
    from gateway.preflight.checks import run_preflight
    from gateway.preflight.evidence import evidence_files, write_pack
    from gateway.preflight.oscal import write_oscal

    if out is not None and sign_key is None:
        raise typer.BadParameter("--out needs --sign-key", param_hint="--sign-key")
    inputs = Inputs(
        config=config, policy=policy, values=tuple(values or ()),
        chart=chart if values else None, manifests=manifests,
        helm=_helm_for(values, helm, chart, release), release=release,
        namespace=namespace,
        admin_url=admin_url, kubeconfig=kubeconfig, kube_context=kube_context,
        audit_public_key=_public_key(audit_public_key), lockfile=lockfile,
        weights_dir=weights_dir, weights_signature=weights_signature,
        weights_public_key=_public_key(weights_public_key))
    criteria = Criteria(regions=tuple(region or ()), jurisdictions=tuple(jurisdiction or ("EU",)),
                        registries=tuple(registry or ()), retention_days=retention_days,
                        region_label=region_label, require_identity=require_identity)
    report, facts = run_preflight(inputs, criteria)
    extra: dict[str, bytes] = {}
    # Read once: a second read of the audit store may see a newer checkpoint than the one
    # whose digest the OSCAL documents carry.
    evidence = evidence_files(report, facts) if oscal is not None or out is not None else {}
    if oscal is not None:
        extra = write_oscal(oscal, report, evidence)
    if out is not None and sign_key is not None:
        write_pack(out, report, facts, sign_key, extra, evidence=evidence)
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2, sort_keys=True))
    else:
        console = results()
        lines = report.to_lines(console.width)
        console.print("\n".join(lines[:-1]), markup=False, highlight=False, soft_wrap=True)
        # the summary wrapped too: an evidence pack path may be long
        print_wrapped(console, lines[-1] + (f"; evidence pack {out}" if out is not None else ""))
    raise typer.Exit(report.exit_code)


@app.command("verify")
def verify(
    directory: Annotated[Path, typer.Argument(help="Evidence pack directory.")],
    key: Annotated[Path, _Opt(
        "--key", "--public-key",
        help="Operator's Ed25519 public key (PEM) you trust (also --public-key, the name "
             "every other verify command uses).")],
    as_json: Annotated[bool, _Opt("--json", help="Print the result as JSON.")] = False,
    max_age: Annotated[str, _Opt(
        "--max-age", help="Oldest acceptable pack (12h, 30d, 2w; 'none': any age).")] = "30d",
    allow_fail: Annotated[bool, _Opt(
        "--allow-fail", help="Accept a pack whose signed result is FAIL.")] = False,
) -> None:
    """Verify an evidence pack offline (signature, every file's digest), then accept it only if
    its signed result is PASS and it is no older than --max-age."""
    from gateway.preflight.acceptance import judge, parse_max_age
    from gateway.preflight.evidence import verify_pack

    limit = parse_max_age(max_age)  # errors: exit 2
    result = verify_pack(directory, existing_public_key(key, "gateway"))  # errors: exit 2
    verdict = judge(result.predicate, max_age=limit, allow_fail=allow_fail) \
        if result.ok else None
    accepted = verdict is not None and verdict.accepted
    if as_json:
        doc = result.to_json()
        if verdict is not None:
            doc |= {"result": verdict.result, "generated_at": verdict.generated_at,
                    "age_s": None if verdict.age is None else int(verdict.age.total_seconds()),
                    "refusals": list(verdict.refusals)}
        doc["accepted"] = accepted
        typer.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        typer.echo(f"signature: {result.signature}")
        for p in result.problems:
            typer.echo(f"  {p}")
        if verdict is not None:
            typer.echo(f"result: {(verdict.result or '?').upper()}, generated "
                       f"{verdict.generated_at or '?'}")
            for r in verdict.refusals:
                typer.echo(f"  {r}")
        typer.echo(f"{'OK' if accepted else 'FAILED'}: {counted(len(result.subjects), 'file')} in "
                   f"{directory}")
    raise typer.Exit(0 if accepted else 1)
