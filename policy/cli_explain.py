"""``policy explain``: which destinations a request may go to, which rule decided, and why.

Registered on the app by :mod:`policy.cli`. It reads a gateway config (``--config``) only as
far as the question needs (keys, a model's replicas, the ``mcp:`` section): the policy package
never imports the gateway. Exit 0: some destination allowed (and the tool, when asked); 1:
none, or the sample text refused; 2: usage or I/O error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from clishell import ConfigOpt, read_input_text

from .cli_common import JsonOpt, PolicyFile, UsageError, console
from .errors import PiiRefused, PolicyError, PolicyFileError
from .evaluate import Decision, Policy, Principal
from .model import _compose
from .pii import PiiPolicy, PiiVerdict
from .runtime import check_binding, replica_url
from .tools import ToolVerdict, check_access


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
        raise UsageError(f"gateway config {path} is not a YAML mapping")
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
        UsageError: The file cannot be read or is not such YAML, naming ``what`` and the file.
    """
    try:
        text = read_input_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {what} {path}: {exc}") from exc
    try:
        return _compose(text, str(path))[0]
    except PolicyFileError as exc:
        raise UsageError(f"{what} {exc}") from exc


_UNENFORCED = ("the gateway config has no policy: section: gateway serve applies no egress "
               "policy and may send this class to every replica; the rules of {file} are not "
               "applied")


def _gateway_enforces(raw: dict[str, Any], config: Path, file: Path, policy: Policy) -> bool:
    """Whether ``gateway serve`` with this config applies ``policy``: ``False`` without a
    ``policy:`` section (the gateway then starts and routes to every replica, unchecked).

    Raises:
        UsageError: The config names another policy (a different revision): explaining
            ``file`` would not be what the gateway does; or a section it cannot start with.
    """
    section = raw.get("policy")
    if section is None:
        return False
    named = section.get("file") if isinstance(section, dict) else None
    if not isinstance(named, str) or not named:
        raise UsageError(f"gateway config {config}: policy: has no file (the gateway does not "
                          "start; run gateway check-config)")
    other = Path(named) if Path(named).is_absolute() else config.parent / named
    try:
        revision = Policy.from_file(other).revision
    except PolicyError as exc:
        raise UsageError(f"gateway config {config} uses policy {other}, which does not load: "
                          f"{exc.message.splitlines()[0] if exc.message else exc.code}") from exc
    if revision != policy.revision:
        raise UsageError(f"gateway config {config} uses policy {other} ({revision}), not "
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
    raise UsageError(f"model {model!r} is not in gateway config {path}")


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
        raise UsageError("give one of --tool, --prompt and --resource")
    if asked and mcp_server is None:
        raise UsageError(f"--{asked[0][0]} needs --mcp-server")
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
            raise UsageError(f"key {key!r} is not in gateway config {config}")
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
                raise UsageError(f"MCP server {mcp_server!r} is not in gateway config {config}")
            pairs.append((str(server.get("destination") or ""), str(server.get("url") or "")))
            if asked:
                kind, name = asked[0]
                tool_verdict = check_access(list(mcp.get("access") or []), key, team,
                                            mcp_server, kind, name)
    elif (model is not None or mcp_server is not None) and not pairs:
        raise UsageError("--model needs --config (to find its replicas) or --destination")
    if default_class is None:
        raise UsageError("give --class, or --config with the key's default data class")
    principal = Principal(key, team)
    if not enforced:
        if text is not None:
            raise UsageError("--text: the gateway config has no policy: section, so the "
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
        out = console()
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
        raise UsageError("--text needs a policy with an enabled pii section")
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

