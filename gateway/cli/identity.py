"""``gateway identity explain``: what a token (or a set of claims) may do, and why.

The same code path as a request: the token is verified with the configured JWKS files
(:mod:`gateway.identity.verify`), its claims go through the identity rules
(:mod:`gateway.identity.rules`), and with ``--model`` the egress policy is asked for that
model's destinations with the identity's team and data class, as ``policy explain`` asks for a
key. ``--claims FILE`` explains a JSON object of claims without a token (marked unverified).
Exit codes: 0 the identity maps to a rule (and may call ``--model``), 1 it is refused (bad
token, no rule, a ``--model`` its rule does not grant: the egress policy is then not asked, as
a request never reaches it), 2 usage.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from clishell import CliError, ConfigOpt, read_input_text, require_config
from gateway.errors import GatewayError

__all__ = ["app", "explain"]

app = typer.Typer(help="OIDC/JWT and mTLS identities: explain a token's access.",
                  no_args_is_help=True)


@app.command()
def explain(
    config: ConfigOpt = None,
    token: Annotated[str | None, typer.Option(
        "--token", help="A bearer token (JWT), verified as a request's would be.")] = None,
    claims: Annotated[Path | None, typer.Option(
        "--claims", help="A JSON file of claims (with iss), explained without verification.")]
        = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="Also ask the egress policy about this model's destinations.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Explain which rule a token's claims match, the team, models and data class it gets,
    and (with --model and an egress policy) where its prompts may go."""
    from gateway.assembly import assemble
    from gateway.config.loader import load
    from gateway.identity.auth import IdentityAuthenticator
    from policy import Principal

    if (token is None) == (claims is None):
        raise CliError("usage_error", "give exactly one of --token and --claims")
    path = require_config(config)
    settings = load(path, os.environ)
    gateway = assemble(settings, path.parent)
    auth = gateway.authenticator
    if not isinstance(auth, IdentityAuthenticator):
        raise CliError("usage_error", f"{path} has no identity: section")
    out: dict[str, Any] = {"verified": token is not None}
    try:
        if token is not None:
            if auth.verifier is None:
                raise CliError("usage_error", f"{path}: identity has no issuers")
            verified = auth.verifier.verify(token)
            identity = auth.identity_of_claims(
                verified.issuer.settings.issuer, verified.claims, kid=verified.kid,
                jwks_sha256=verified.jwks_sha256)
        else:
            assert claims is not None
            doc = json.loads(read_input_text(claims))
            if not isinstance(doc, dict) or not isinstance(doc.get("iss"), str):
                raise CliError("usage_error", f"{claims}: a JSON object with an iss claim")
            identity = auth.identity_of_claims(doc["iss"], doc)
    except GatewayError as exc:
        out.update(ok=False, status=exc.status, code=exc.code, reason=exc.message)
        _render(out, as_json)
        raise typer.Exit(1) from exc
    out.update(identity.audit_fields())
    rule = next(r for r in auth.settings.rules if r.id == identity.rule)
    # The one source the rule trusts (its issuer:, or the only source configured).
    out.update(rule_source=auth.settings.source_of(rule), rule_source_implicit=rule.issuer is None)
    out.update(ok=True, key_id=identity.key_id, team=identity.team,
               models=sorted(identity.models), data_class=identity.data_class)
    if model is not None:
        found = settings.model_by_label().get(model)
        if found is None:
            raise CliError("usage_error", f"model {model!r} is not in {path}")
        out["model"] = found.name
        out["model_allowed"] = "*" in identity.models or found.name in identity.models
        if out["model_allowed"] and gateway.policy is not None:
            decisions = gateway.policy.explain(
                Principal(identity.key_id, identity.team), identity.data_class,
                [r.destination for r in found.replicas])
            out["egress"] = [d.as_record() for d in decisions]
    _render(out, as_json)
    if out.get("model_allowed") is False:
        raise typer.Exit(1)


def _render(out: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(out, indent=2, sort_keys=True))
        return
    if not out["ok"]:
        typer.echo(f"refused ({out['status']} {out['code']}): {out['reason']}")
        return
    typer.echo(f"{'verified token' if out['verified'] else 'claims (NOT verified)'} of "
               f"{out['issuer']}, subject {out['subject']}")
    if out.get("kid"):
        typer.echo(f"  key {out['kid']} of JWKS sha256 {out['jwks_sha256']}")
    decided = ", ".join(f"{k}={v}" for k, v in out["decided_by"].items()) or "(any caller)"
    implicit = ", implicit: the only source" if out["rule_source_implicit"] else ""
    typer.echo(f"  rule {out['rule']} matched on {decided} (source {out['rule_source']}"
               f"{implicit})")
    typer.echo(f"  team {out['team'] or '-'}, org {out['org'] or '-'}, data class "
               f"{out['data_class']}, models {', '.join(out['models']) or '-'}")
    if "model" in out:
        if out["model_allowed"]:
            typer.echo(f"  model {out['model']}: allowed")
        else:
            typer.echo(f"  model {out['model']}: NOT allowed (the rule grants "
                       f"{', '.join(out['models']) or 'no model'}): a request is refused (403) "
                       "before the egress policy")
    for d in out.get("egress", []):
        typer.echo(f"    {d['destination'] or '-'}: {d['decision']} "
                   f"({d['rule_id'] or 'no rule matched'}: {d['reason']})")
