"""``policy``: check a policy, explain a routing decision, render Kubernetes egress rules.

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
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from clishell import (
    EXIT_FAILED,
    EXIT_USAGE,
    CliError,
    ConfigOpt,
    VerboseOpt,
    VersionOpt,
    read_input_text,
    run,
)
from clishell.consoles import print_wrapped

from .addresses import parse_host
from .egress import EgressMatcher
from .errors import PiiRefused, PolicyError, PolicyFileError, UnknownDataClass
from .evaluate import Decision, Policy, Principal
from .model import PolicyDocument, _compose
from .pii import PiiPolicy, PiiVerdict
from .render import cilium_networkpolicy, helm_values, networkpolicy
from .runtime import check_binding, replica_url
from .tools import ToolVerdict, check_access

app = typer.Typer(
    name="policy", add_completion=False, no_args_is_help=True,
    help="Zero-trust egress policy: validate, explain decisions, render NetworkPolicies.",
)

PolicyFile = Annotated[Path, typer.Argument(help="Policy YAML file.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


class _UsageError(CliError):
    """A problem with the command line or an input file other than the policy (exit 2)."""

    def __init__(self, message: str) -> None:
        super().__init__("usage_error", message)


def _out() -> Console:
    # Not a terminal (pipes, CI logs): 80 columns, the width a file or a log is read at; the
    # tables' cells wrap at word boundaries and fold only a token longer than their column.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 80)


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
    out = _out()
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


def _binding_problem(policy: Policy, url: str, dest_id: str) -> str | None:
    try:
        check_binding(policy, url, dest_id)
    except PolicyError as exc:
        return f"{exc} (gateway refuses to start)"
    return None


def _read_gateway_config(path: Path) -> dict[str, Any]:
    """Read the three things ``explain --config`` needs from a gateway config, nothing else.

    ``keys[]`` (``id``, ``team``, ``data_class``; ``keys_file`` appended as the gateway does)
    and ``models[]`` (``name``, ``aliases``, ``replicas[].destination``/``url``). The policy
    package never imports the gateway, so this is a deliberately small reading of the file, not
    the gateway's validation (run ``gateway check-config`` for that).
    """
    raw = _read_yaml(path, "gateway config")
    if not isinstance(raw, dict):
        raise _UsageError(f"gateway config {path} is not a YAML mapping")
    keys_file = raw.get("keys_file")
    if isinstance(keys_file, str) and keys_file:
        # The gateway appends the keys of keys_file (relative to its config) to keys.
        kpath = Path(keys_file) if Path(keys_file).is_absolute() else path.parent / keys_file
        extra = _read_yaml(kpath, "keys_file")
        inline = raw.get("keys")
        raw["keys"] = [*(inline if isinstance(inline, list) else []),
                       *(extra if isinstance(extra, list) else [])]
    return raw


def _read_yaml(path: Path, what: str) -> Any:
    """``path`` parsed as the gateway parses it: a key written twice in one mapping is refused
    (PyYAML keeps the last one, so explain could show another key than the gateway serves),
    and a YAML error is one line with its line number.

    Raises:
        _UsageError: The file cannot be read or is not such YAML, naming ``what`` and the file.
    """
    try:
        text = read_input_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise _UsageError(f"cannot read {what} {path}: {exc}") from exc
    try:
        return _compose(text, str(path))[0]
    except PolicyFileError as exc:
        raise _UsageError(f"{what} {exc}") from exc


_UNENFORCED = ("the gateway config has no policy: section: gateway serve applies no egress "
               "policy and may send this class to every replica; the rules of {file} are not "
               "applied")


def _gateway_enforces(raw: dict[str, Any], config: Path, file: Path, policy: Policy) -> bool:
    """Whether ``gateway serve`` with this config applies ``policy``: ``False`` without a
    ``policy:`` section (the gateway then starts and routes to every replica, unchecked).

    Raises:
        _UsageError: The config names another policy (a different revision): explaining
            ``file`` would not be what the gateway does; or a section it cannot start with.
    """
    section = raw.get("policy")
    if section is None:
        return False
    named = section.get("file") if isinstance(section, dict) else None
    if not isinstance(named, str) or not named:
        raise _UsageError(f"gateway config {config}: policy: has no file (the gateway does not "
                          "start; run gateway check-config)")
    other = Path(named) if Path(named).is_absolute() else config.parent / named
    try:
        revision = Policy.from_file(other).revision
    except PolicyError as exc:
        raise _UsageError(f"gateway config {config} uses policy {other}, which does not load: "
                          f"{exc.message.splitlines()[0] if exc.message else exc.code}") from exc
    if revision != policy.revision:
        raise _UsageError(f"gateway config {config} uses policy {other} ({revision}), not "
                          f"{file} ({policy.revision}): explain {other} to see what the "
                          "gateway does")
    return True


def _model_destinations(raw: dict[str, Any], model: str, path: Path,
                        policy: Policy | None) -> list[tuple[str, str, str | None]]:
    """``(destination id, replica url, problem)`` per replica of ``model``; a replica without
    ``url`` is served at its destination's ``url`` by the gateway's rule
    (:func:`policy.runtime.replica_url`), and ``problem`` says why the gateway refuses to start
    when that destination cannot supply one (``url`` is then ``"?"``; always without a policy,
    ``policy`` ``None``)."""
    def url_of(replica: dict[str, Any]) -> tuple[str, str | None]:
        if replica.get("url"):
            return str(replica["url"]), None
        if policy is None:
            return "?", ("no url, and without a policy: section its destination cannot supply "
                         "one (gateway refuses to start)")
        try:
            return replica_url(policy, str(replica.get("destination") or "")), None
        except PolicyError as exc:
            return "?", f"{exc} (gateway refuses to start)"

    for m in raw.get("models") or []:
        if isinstance(m, dict) and (m.get("name") == model or model in (m.get("aliases") or [])):
            return [(str(r.get("destination") or ""), *url_of(r))
                    for r in m.get("replicas") or [] if isinstance(r, dict)]
    raise _UsageError(f"model {model!r} is not in gateway config {path}")


@app.command()
def explain(
    file: PolicyFile,
    key: Annotated[str, typer.Option("--key", help="API key id.")],
    model: Annotated[str | None, typer.Option(
        "--model", help="Model name or alias (its replicas' destinations, from --config).")] = None,
    data_class: Annotated[str | None, typer.Option(
        "--class", help="Data class; with --config, a requested change of the key's default "
        "(as the classification header would ask).")] = None,
    team: Annotated[str | None, typer.Option("--team", help="The key's team.")] = None,
    destinations: Annotated[list[str] | None, typer.Option(
        "--destination", help="Destination id to evaluate (repeatable).")] = None,
    mcp_server: Annotated[str | None, typer.Option(
        "--mcp-server", help="MCP server name (its destination and access rules, from "
        "--config's mcp: section).")] = None,
    tool: Annotated[str | None, typer.Option(
        "--tool", help="With --mcp-server: may the key call this tool?")] = None,
    prompt: Annotated[str | None, typer.Option(
        "--prompt", help="With --mcp-server: may the key get this prompt?")] = None,
    resource: Annotated[str | None, typer.Option(
        "--resource", help="With --mcp-server: may the key read this resource URI?")] = None,
    config: ConfigOpt = None,
    text: Annotated[str | None, typer.Option(
        "--text", help="A sample prompt: what the policy's pii section finds in it, each "
        "finding's action, and the class routing then uses (scanned here, sent nowhere).")] = None,
    as_json: JsonOpt = False,
) -> int:
    """Explain which destinations a request may go to, which rule decided, and why.

    With a gateway config (--config or SG_CONFIG): the key's team and data class from its
    keys[], and --model's destinations from its replicas[].destination. With --text: the
    sensitive data found in a sample prompt and its effect (class raised, masked, refused).
    With --mcp-server S --tool T (or --prompt P, or --resource URI): may key K call tool T
    (get prompt P, read resource URI) on MCP server S with its class (the access rules of
    mcp.access, then the policy for S's destination); exit 1 when either refuses.
    """
    tool_verdict: ToolVerdict | None = None
    asked = [(k, n) for k, n in (("tool", tool), ("prompt", prompt), ("resource", resource))
             if n is not None]
    if len(asked) > 1:
        raise _UsageError("give one of --tool, --prompt and --resource")
    if asked and mcp_server is None:
        raise _UsageError(f"--{asked[0][0]} needs --mcp-server")
    policy = Policy.from_file(file)
    default_class = data_class
    header: str | None = None
    pairs: list[tuple[str, str]] = [(d, "") for d in destinations or []]
    # Index in pairs -> why the gateway cannot take that replica's url from its destination.
    unsuppliable: dict[int, str] = {}
    enforced = True  # without --config: FILE is the policy the question is about
    if config is not None:
        raw = _read_gateway_config(config)
        enforced = _gateway_enforces(raw, config, file, policy)
        entry = next((k for k in raw.get("keys") or []
                      if isinstance(k, dict) and k.get("id") == key), None)
        if entry is None:
            raise _UsageError(f"key {key!r} is not in gateway config {config}")
        team = team or entry.get("team")
        default_class = str(entry.get("data_class") or "internal")
        header = data_class
        if model is not None:
            for dest_id, url, problem in _model_destinations(raw, model, config,
                                                             policy if enforced else None):
                if problem is not None:
                    unsuppliable[len(pairs)] = problem
                pairs.append((dest_id, url))
        if mcp_server is not None:
            section = raw.get("mcp")
            mcp: dict[str, Any] = section if isinstance(section, dict) else {}
            server = next((s for s in mcp.get("servers") or []
                           if isinstance(s, dict) and s.get("name") == mcp_server), None)
            if server is None:
                raise _UsageError(f"MCP server {mcp_server!r} is not in gateway config {config}")
            pairs.append((str(server.get("destination") or ""), str(server.get("url") or "")))
            if asked:
                kind, name = asked[0]
                tool_verdict = check_access(list(mcp.get("access") or []), key, team,
                                            mcp_server, kind, name)
    elif (model is not None or mcp_server is not None) and not pairs:
        raise _UsageError("--model needs --config (to find its replicas) or --destination")
    if default_class is None:
        raise _UsageError("give --class, or --config with the key's default data class")
    principal = Principal(key, team)
    if not enforced:
        if text is not None:
            raise _UsageError("--text: the gateway config has no policy: section, so the "
                              "gateway scans nothing")
        # No policy: the classification header is not read, every replica is a candidate.
        resolved = default_class
        pii = None
        reason = _UNENFORCED.format(file=file)
        explained = [Decision(i not in unsuppliable, None, unsuppliable.get(i, reason), "", d)
                     for i, (d, _) in enumerate(pairs)]
    else:
        resolved = policy.resolve_class(default_class, header, principal)
        pii = _pii_effect(policy, principal, resolved, text) if text is not None else None
        if pii is not None:
            resolved = pii["class_after"]
        ids: list[str | None] | None = [d or None for d, _ in pairs] if pairs else None
        explained = policy.explain(principal, resolved, ids)
    urls = [url for _, url in pairs] if pairs else [""] * len(explained)
    decisions: list[tuple[Decision, str]] = []
    for i, (decision, url) in enumerate(zip(explained, urls, strict=True)):
        if not enforced:
            decisions.append((decision, url))
            continue
        # A replica outside the destination it names never gets a request: the gateway
        # refuses to start with it (check_binding), whatever the rules say.
        mismatch = unsuppliable.get(i) or (_binding_problem(policy, url, decision.destination_id)
                                           if url and decision.destination_id else None)
        if mismatch is not None:
            decision = Decision(False, None, mismatch, policy.revision, decision.destination_id)
        decisions.append((decision, url))
    allowed = [d for d, _ in decisions if d.allowed]
    tool_ok = tool_verdict is None or tool_verdict.allowed
    if as_json:
        revision = policy.revision if enforced else None
        doc: dict[str, Any] = {
            "key": key, "team": team, "data_class": resolved, "model": model,
            "revision": revision, "enforced": enforced,
            "allowed": [d.destination_id for d in allowed],
            "decisions": [{**d.as_record(), "policy_revision": revision, "replica": url or None}
                          for d, url in decisions],
            **({"pii": pii} if pii is not None else {}),
        }
        if tool_verdict is not None:
            kind, name = asked[0]
            doc["mcp"] = {"server": mcp_server, kind: name, "allowed": tool_verdict.allowed,
                          "reason": tool_verdict.reason}
        print(json.dumps(doc, indent=2))
    else:
        out = _out()
        out.print(escape(f"key {key} (team {team or '-'}), data class {resolved}, "
                         f"policy {policy.revision if enforced else 'none'}"))
        if not enforced:
            out.print("[bold red]WARNING: " + escape(
                f"gateway config {config} has no policy: section: egress is NOT restricted "
                f"(gateway serve starts and uses every replica; {file} is not applied)") + "[/]",
                soft_wrap=True)
        if pii is not None:
            _print_pii(out, pii)
        # One block per destination, not a table: a reason is a sentence, and a table cell
        # 15 columns wide broke it into a word a line at 80 columns.
        no_rule = "(no rule matched)" if enforced else "(no policy)"
        for d, url in decisions:
            verdict = "[green]allow[/]" if d.allowed else "[red]deny[/] "
            replica = f" (replica {url})" if url else ""
            out.print(f"{verdict} {escape(d.destination_id or '-')}{escape(replica)}: "
                      f"{escape(d.rule_id or no_rule)}", soft_wrap=True)
            out.print(f"      {escape(d.reason)}", soft_wrap=True)
        if tool_verdict is not None:
            kind, name = asked[0]
            out.print((f"[green]{kind} allowed[/]: " if tool_verdict.allowed else
                       f"[bold red]{kind} refused (403)[/]: ")
                      + escape(f"{mcp_server}/{name}: {tool_verdict.reason}"), soft_wrap=True)
        if not allowed:
            out.print("[bold red]no destination allowed: the gateway answers 403[/]")
    if pii is not None and pii["refused"]:
        return 1
    return 0 if allowed and tool_ok else 1


def _pii_effect(policy: Policy, principal: Principal, data_class: str,
                text: str) -> dict[str, Any]:
    """What the gateway's pii stage does with ``text`` for this key: the verdict's record,
    the refused entity types and the text as forwarded (masked)."""
    if policy.pii is None:
        raise _UsageError("--text needs a policy with an enabled pii section")
    try:
        verdict = policy.pii.inspect(text, principal.key, principal.team, data_class)
    except PiiRefused as exc:
        assert isinstance(exc.verdict, PiiVerdict)
        verdict = exc.verdict
    return {**verdict.as_record(), "refused": list(verdict.refused),
            "forwarded_text": None if verdict.refused else PiiPolicy.masked(text, verdict)}


def _print_pii(out: Console, pii: dict[str, Any]) -> None:
    found = ", ".join(f"{e} x{n} -> {pii['actions'][e]}"
                      + (f" (rule {pii['rules'][e]})" if pii["rules"].get(e) else "")
                      for e, n in pii["entities"].items()) or "nothing"
    out.print(escape(f"sample text: {found}; class {pii['class_before']} -> "
                     f"{pii['class_after']}"))
    if pii["refused"]:
        out.print("[bold red]" + escape("refused: the gateway answers 403 pii_refused naming "
                                        + ", ".join(pii["refused"])) + "[/]")
    elif pii["forwarded_text"] is not None and "mask" in pii["actions"].values():
        out.print(escape(f"forwarded as: {pii['forwarded_text']}"))


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
        raise _UsageError(f"target must be HOST:PORT, not {target!r}")
    host, port = host.strip("[]"), int(port_text)
    matcher = EgressMatcher(policy)
    checks: list[dict[str, Any]] = []
    lookup = matcher.check_lookup(host, port)
    is_name = lookup.address is None and lookup.destination_id is not None
    if lookup.allowed and lookup.address is None and not is_name and not resolved:
        # localhost (or any name under unsafe_allow_all): the lookup is allowed and no
        # destination pins where it goes, so the answer is the connect check of whatever the
        # host resolves it to. Without that address there is no verdict to give.
        raise _UsageError(
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
        out = _out()
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
            raise _UsageError(f"{option} takes key=value, not {item!r}")
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
