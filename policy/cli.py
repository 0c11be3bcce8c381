"""``policy``: check a policy, explain a routing decision, render Kubernetes egress rules.

``explain`` lives in :mod:`policy.cli_explain` (it reads a gateway config too); what the
commands share, in :mod:`policy.cli_common`.

Exit codes (the shared boundary, :func:`clishell.run`): 0 ok; 1 verification failed (invalid
policy, nothing allowed, refused render); 2 usage or I/O error. ``-v``/``--verbose`` shows
tracebacks, ``--version`` the version.
"""

from __future__ import annotations

import enum
import json
import socket
import sys
from collections import defaultdict
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from clishell import EXIT_FAILED, EXIT_USAGE, CliError, VerboseOpt, VersionOpt, run
from clishell.consoles import print_wrapped

from .addresses import parse_host
from .cli_common import JsonOpt, PolicyFile, UsageError, console
from .cli_explain import explain
from .egress import EgressMatcher
from .errors import PolicyError, PolicyFileError, UnknownDataClass
from .evaluate import Policy
from .model import PolicyDocument
from .render import cilium_networkpolicy, helm_values, networkpolicy

app = typer.Typer(
    name="policy", add_completion=False, no_args_is_help=True,
    help="Zero-trust egress policy: validate, explain decisions, render NetworkPolicies.",
)


@app.callback()
def _root(version: VersionOpt = False, verbose: VerboseOpt = False) -> None:
    """Zero-trust egress policy tools."""


@app.command()
def check(file: PolicyFile, as_json: JsonOpt = False) -> int:
    """Validate a policy and summarise destinations (by jurisdiction and region) and rules."""
    policy = Policy.from_file(file)
    doc = policy.document
    if as_json:
        by: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
        for d in doc.destinations:
            by[d.jurisdiction][d.region].append(d.id)
        print(json.dumps({
            "ok": True, "file": str(file), "revision": policy.revision,
            "unsafe_allow_all": doc.unsafe_allow_all, "data_classes": list(doc.data_classes),
            "destinations_by_jurisdiction": by,
            "destinations": [_dest_json(d) for d in doc.destinations],
            "rules": [r.model_dump(mode="json", by_alias=True) for r in doc.rules],
        }, indent=2))
        return 0
    out = console()
    out.print(f"[bold green]ok[/] {escape(str(file))}  revision {policy.revision}")
    if doc.unsafe_allow_all:
        out.print("[bold red]WARNING: unsafe_allow_all is on: every request is allowed "
                  "(development only)[/]")
    out.print(f"data classes (least to most sensitive): {', '.join(doc.data_classes)}")
    # Destinations as blocks too: six columns (a cluster DNS name among them) did not fit 80
    # columns without splitting addresses mid-token.
    out.print(f"{len(doc.destinations)} destinations")
    for d in sorted(doc.destinations, key=lambda d: (d.jurisdiction, d.region, d.id)):
        out.print(escape(f"   {d.id}  {_endpoint_text(d)}"), soft_wrap=True)
        _print_wrapped(out, f"{d.jurisdiction} {d.region}; purpose {d.purpose}; operator "
                            f"{d.operator}; tags {', '.join(d.tags) or '-'}")
    # Rules as blocks, not a table: seven columns of sentences did not fit 80 columns.
    out.print(f"{len(doc.rules)} rules (first match decides; no match denies)")
    for i, r in enumerate(doc.rules, 1):
        who = ", ".join([*(f"key:{k}" for k in r.principals.keys),
                         *(f"team:{t}" for t in r.principals.teams)]) or "everyone"
        out.print(escape(f"{i:>2} {r.effect:5} {r.id}"), soft_wrap=True)
        line = (f"who {who}; classes {', '.join(r.classes or ['any'])}; to "
                f"{', '.join(r.destinations or ['any inference'])}; "
                f"requires {_requirements(r.constraints)}")
        _print_wrapped(out, line)
    return 0


def _print_wrapped(out: Console, line: str) -> None:
    """A detail line, six spaces in, wrapped at word boundaries to the console's width."""
    print_wrapped(out, line, indent=6)


def _requirements(cons: Any) -> str:
    """A rule's constraints as an operator reads them: ``jurisdiction EU; tags no-retention``.

    Lists are words, not Python syntax: the alternatives of ``jurisdiction``, ``regions`` and
    ``operators`` joined with "or", the tags (all required) with "and". ``-`` when none.
    """
    def words(value: str | list[str], joiner: str) -> str:
        return value if isinstance(value, str) else f" {joiner} ".join(value)

    parts = []
    if cons.jurisdiction is not None:
        parts.append(f"jurisdiction {words(cons.jurisdiction, 'or')}")
    if cons.regions is not None:
        parts.append(f"regions {words(cons.regions, 'or')}")
    if cons.require_tags:
        parts.append(f"tags {words(cons.require_tags, 'and')}")
    if cons.operators is not None:
        parts.append(f"operators {words(cons.operators, 'or')}")
    return "; ".join(parts) or "-"


def _endpoint_text(d: Any) -> str:
    ep = d.endpoint
    host = ep.hostname or str(ep.network)
    return f"{host}:{','.join(map(str, sorted(ep.ports)))}"


def _dest_json(d: Any) -> dict[str, Any]:
    ep = d.endpoint
    return {
        "id": d.id, "hostname": ep.hostname,
        "network": str(ep.network) if ep.network is not None else None,
        "ports": sorted(ep.ports), "region": d.region, "jurisdiction": d.jurisdiction,
        "operator": d.operator, "tags": list(d.tags), "purpose": d.purpose,
    }


# In registration order: check, explain, connect, schema, networkpolicy (the help lists them so).
app.command()(explain)


@app.command(name="connect")
def connect_cmd(
    file: PolicyFile,
    target: Annotated[str, typer.Argument(
        help="HOST:PORT ([v6]:PORT for IPv6), as a client would connect.", show_default=False)],
    resolved: Annotated[list[str] | None, typer.Option(
        "--resolved", help="For a hostname: an address it resolves to (repeatable); checked "
        "as the transport would. No DNS query is made.")] = None,
    as_json: JsonOpt = False,
) -> int:
    """Would the process be allowed to connect to HOST:PORT? (the transport/guard checks)."""
    policy = Policy.from_file(file)
    host, sep, port_text = target.rpartition(":")
    if not sep or not port_text.isdigit() or not host:
        raise UsageError(f"target must be HOST:PORT, not {target!r}")
    host, port = host.strip("[]"), int(port_text)
    matcher = EgressMatcher(policy)
    checks: list[dict[str, Any]] = []
    lookup = matcher.check_lookup(host, port)
    is_name = lookup.address is None and lookup.destination_id is not None
    if lookup.allowed and lookup.address is None and not is_name and not resolved:
        # localhost (or any name under unsafe_allow_all): the lookup is allowed and no
        # destination pins where it goes, so the answer is the connect check of whatever the
        # host resolves it to. Without that address there is no verdict to give.
        raise UsageError(
            f"{host!r} is resolved by the host ({lookup.reason}), not pinned by a destination: "
            f"give --resolved ADDRESS (e.g. --resolved 127.0.0.1) to check the connection"
        )
    if is_name or not lookup.allowed or lookup.address is None:
        checks.append({"check": "lookup", "allowed": lookup.allowed,
                       "destination": lookup.destination_id, "reason": lookup.reason})
    addresses = list(resolved or [])
    if lookup.address is not None:
        addresses = [lookup.address]
    elif is_name and addresses:
        dest = policy.destinations[lookup.destination_id or ""]
        try:
            matcher.pins.pin(str(parse_host(host)), matcher.check_resolved(dest, addresses))
            checks.append({"check": "resolution", "allowed": True, "destination": dest.id,
                           "reason": f"every address fits destination {dest.id}"})
        except PolicyError as exc:
            checks.append({"check": "resolution", "allowed": False, "destination": dest.id,
                           "reason": getattr(exc, "reason", str(exc))})
            addresses = []
    for address in addresses:
        v = matcher.check_connect(address, port)
        checks.append({"check": f"connect {address}", "allowed": v.allowed,
                       "destination": v.destination_id, "reason": v.reason})
    ok = bool(checks) and all(c["allowed"] for c in checks)
    if as_json:
        print(json.dumps({"target": target, "allowed": ok, "revision": policy.revision,
                          "checks": checks}, indent=2))
    else:
        out = console()
        for c in checks:
            verdict = "[green]allow[/]" if c["allowed"] else "[red]deny[/]"
            out.print(f"{verdict} {escape(c['check'])}: {escape(c['reason'])}")
        if is_name and not addresses and lookup.allowed and not resolved:
            out.print("(give --resolved ADDRESS to check what the name resolves to)")
    return 0 if ok else 1


@app.command()
def schema() -> int:
    """Print the JSON Schema of the policy document (for editors and CI linters)."""
    print(json.dumps(PolicyDocument.model_json_schema(by_alias=True), indent=2))
    return 0


class Format(enum.StrEnum):
    """Output formats of ``policy networkpolicy``."""

    NETWORKPOLICY = "networkpolicy"
    CILIUM = "cilium"
    HELM = "helm-values"


def _labels(items: list[str] | None, option: str) -> dict[str, str] | None:
    if not items:
        return None
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UsageError(f"{option} takes key=value, not {item!r}")
        out[k] = v
    return out


def _system_resolve(host: str, port: int) -> list[str]:
    return sorted({str(i[4][0]) for i in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


@app.command(name="networkpolicy")
def networkpolicy_cmd(
    file: PolicyFile,
    fmt: Annotated[Format, typer.Option(
        "--format", help="networkpolicy (Kubernetes), cilium (toFQDNs) or helm-values.",
    )] = Format.NETWORKPOLICY,
    namespace: Annotated[str | None, typer.Option("--namespace", help="metadata.namespace")] = None,
    pod_selector: Annotated[list[str] | None, typer.Option(
        "--pod-selector", help="Gateway pod label k=v (repeatable).")] = None,
    name: Annotated[str, typer.Option("--name", help="metadata.name")] = "sovereign-gateway-egress",
    resolve: Annotated[bool, typer.Option(
        "--resolve", help="Resolve hostname destinations now (a snapshot of DNS).")] = False,
    dns_namespace: Annotated[str, typer.Option(
        "--dns-namespace", help="Namespace of the cluster DNS.")] = "kube-system",
    dns_label: Annotated[list[str] | None, typer.Option(
        "--dns-label", help="Cluster DNS pod label k=v (repeatable).")] = None,
) -> int:
    """Render the destinations as Kubernetes egress rules (or Helm values) on stdout."""
    policy = Policy.from_file(file)
    resolver = _system_resolve if resolve else None
    selector = _labels(pod_selector, "--pod-selector")
    dns = _labels(dns_label, "--dns-label")
    doc: dict[str, Any]
    if fmt == Format.HELM:
        doc = helm_values(policy, resolver)
    elif fmt == Format.CILIUM:
        doc = cilium_networkpolicy(policy, name=name, namespace=namespace, pod_selector=selector,
                                   dns_namespace=dns_namespace, dns_labels=dns)
    else:
        doc = networkpolicy(policy, name=name, namespace=namespace, pod_selector=selector,
                            resolve=resolver, dns_namespace=dns_namespace, dns_labels=dns)
        fqdns = doc["metadata"]["annotations"].get("sovereign-gateway/unenforced-fqdns")
        if fqdns:
            print(f"policy: note: hostname destinations not enforced by this NetworkPolicy: "
                  f"{fqdns} (use --resolve, resolves_to, or --format cilium)", file=sys.stderr)
    sys.stdout.write(f"# generated by `policy networkpolicy` from {file} ({policy.revision})\n")
    sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return 0


def _describe(exc: BaseException) -> CliError | None:
    """Exit 1 for a policy that does not hold (invalid, refused render); 2 for one that cannot
    be read and for an unknown data class asked on the command line."""
    if not isinstance(exc, PolicyError):
        return None
    if isinstance(exc, PolicyFileError):
        failed = exc.code != "policy_unreadable"
        # One error line per problem (`file:line: key: problem`); --json lists them too.
        first, *rest = exc.problems
        return CliError(exc.code, str(first), exit_code=EXIT_FAILED if failed else EXIT_USAGE,
                        more=tuple((exc.code, str(p)) for p in rest),
                        document={"ok": False,
                                  "error": {"code": exc.code, "message": str(first)},
                                  "problems": [p.to_json() for p in exc.problems]})
    failed = not isinstance(exc, UnknownDataClass)
    return CliError(exc.code, str(exc), exit_code=EXIT_FAILED if failed else EXIT_USAGE)


def main(argv: list[str] | None = None) -> int:
    """Console entry point: the shared CLI boundary (:func:`clishell.run`)."""
    return run(app, argv, prog="policy", describe=_describe)


if __name__ == "__main__":
    sys.exit(main())
