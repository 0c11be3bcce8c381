"""Policy, running-gateway and weights checks (the audit log's are in
:mod:`gateway.preflight.checks_audit`).

Policy checks use the ``policy`` package's public API only (``Policy.destinations``,
``Policy.evaluate``, ``Policy.unsafe_allow_all``); the weights check uses
``weights.verify_tree`` and ``weights.signing.verify_signature``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from clishell.text import counted
from gateway.preflight.inputs import Facts
from gateway.preflight.report import CheckResult, outcome, skipped

__all__ = ["check_allow_all", "check_destinations", "check_guard", "check_unsafe",
           "check_weights"]


def _principals(policy: Any) -> list[Any]:
    from policy import Principal

    out = [Principal("preflight-anyone", None)]
    for rule in policy.document.rules:
        out += [Principal(k, None) for k in rule.principals.keys]
        out += [Principal("preflight-team-member", t) for t in rule.principals.teams]
    return out


def check_destinations(facts: Facts) -> CheckResult:
    """Every destination (and every one reachable per data class) is in region/jurisdiction."""
    cid, title, crit = ("policy.destinations", "every destination allowed for each data class "
                        "is in an allowed jurisdiction and region", ("SOV-3", "SOV-2"))
    policy, c = facts.policy, facts.criteria
    if policy is None:
        return skipped(cid, title, "no policy or gateway config given", crit)
    if not c.regions:
        return skipped(cid, title, "no allowed regions given (--region)", crit)
    per_class: dict[str, list[str]] = {}
    principals = _principals(policy)
    for cls in policy.classes:
        per_class[cls] = sorted(d for d in policy.destinations if any(
            policy.evaluate(p, cls, d).allowed for p in principals))
    where = {d.id: {"region": d.region, "jurisdiction": d.jurisdiction, "purpose": d.purpose}
             for d in policy.destinations.values()}
    problems = [f"destination {i} is in {w['region']} ({w['jurisdiction']})"
                for i, w in sorted(where.items())
                if w["region"] not in c.regions or w["jurisdiction"] not in c.jurisdictions]
    if problems:  # what was allowed, so the operator can tell a wrong policy from a wrong flag
        problems.append(f"allowed: regions {', '.join(c.regions)} (--region), jurisdictions "
                        f"{', '.join(c.jurisdictions)} (--jurisdiction)")
    evidence = {"policy_revision": policy.revision, "allowed_per_class": per_class,
                "destinations": where, "allowed_regions": list(c.regions),
                "allowed_jurisdictions": list(c.jurisdictions)}
    return outcome(cid, title, problems, f"{counted(len(where), 'destination')}, all in "
                   f"{', '.join(c.regions)} ({', '.join(c.jurisdictions)})", evidence, crit)


def check_allow_all(facts: Facts) -> CheckResult:
    """No allow rule without principals, classes, destinations and constraints."""
    cid, title, crit = ("policy.no-allow-all", "no rule allows everything", ("SOV-3",))
    if facts.policy is None:
        return skipped(cid, title, "no policy or gateway config given", crit)
    wide = [r.id for r in facts.policy.document.rules
            if r.effect == "allow" and not r.principals.keys and not r.principals.teams
            and r.classes is None and r.destinations is None
            and r.constraints.jurisdiction is None and r.constraints.regions is None
            and not r.constraints.require_tags and r.constraints.operators is None]
    evidence = {"rules": [r.id for r in facts.policy.document.rules], "allow_everything": wide}
    return outcome(cid, title, [f"rule {r} allows every key, class and destination"
                                for r in wide], "no unrestricted allow rule", evidence, crit)


def check_unsafe(facts: Facts) -> CheckResult:
    """The ``unsafe_allow_all`` switch is off (in the file and, if given, the running policy)."""
    cid, title, crit = ("policy.unsafe-off", "the unsafe allow-all switch is off", ("SOV-3",))
    running = (facts.status or {}).get("policy") or {}
    if facts.policy is None and not running:
        return skipped(cid, title, "no policy, config or running gateway given", crit)
    problems = []
    if facts.policy is not None and facts.policy.unsafe_allow_all:
        problems.append(f"unsafe_allow_all is on in {facts.policy.source}")
    if running.get("unsafe_allow_all"):
        problems.append("unsafe_allow_all is on in the running gateway")
    evidence = {"file": facts.policy.unsafe_allow_all if facts.policy is not None else None,
                "running": running.get("unsafe_allow_all")}
    return outcome(cid, title, problems, "unsafe_allow_all is off", evidence, crit)


def check_guard(facts: Facts) -> CheckResult:
    """The running gateway's guard enforces on the standard loop; self-test passed."""
    cid, title, crit = ("gateway.guard", "process guard in enforce mode on the standard loop, "
                        "self-test passed", ("SOV-3", "SOV-7"))
    st = facts.status
    if st is None:
        return skipped(cid, title, "no running gateway given (--admin-url)", crit)
    guard, pol, loop = st.get("guard") or {}, st.get("policy") or {}, str(st.get("loop", ""))
    problems = []
    if guard.get("mode") != "enforce":
        problems.append(f"guard mode is {guard.get('mode')!r}, not 'enforce'")
    if not guard.get("installed"):
        problems.append("guard is not installed")
    if guard.get("self_test") != "passed":
        problems.append(f"guard self-test {guard.get('self_test')!r}")
    if not loop.startswith("asyncio.") or "uvloop" in loop:
        problems.append(f"event loop {loop!r} is not the standard asyncio loop")
    if facts.policy is not None and pol.get("revision") != facts.policy.revision:
        problems.append(f"running policy {pol.get('revision')} is not {facts.policy.revision}")
    evidence = {"guard": guard, "loop": loop, "policy_revision": pol.get("revision"),
                "config_revision": st.get("config_revision")}
    return outcome(cid, title, problems, f"enforce on {loop}, self-test passed", evidence, crit)


def _file_sha256(path: Path | None) -> str | None:
    """SHA-256 hex of a file's bytes (what was checked, not just its name), or None."""
    if path is None:
        return None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _key_fingerprint(path: Path | None) -> str | None:
    """SHA-256 hex of the public key's DER SubjectPublicKeyInfo (``openssl pkey -pubin
    -outform DER | sha256sum``), or None when absent or unreadable."""
    if path is None:
        return None
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError, TypeError):
        return None
    return hashlib.sha256(key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).hexdigest()


def check_weights(facts: Facts) -> CheckResult:
    """Weights in use match the lockfile and a verified model_signing signature."""
    cid, title, crit = ("weights.locked-signed", "weights in use match a lockfile and a "
                        "verified signature", ("SOV-5", "SOV-3"))
    i = facts.inputs
    if i.lockfile is None or i.weights_dir is None:
        return skipped(cid, title, "no --lockfile and --weights given", crit)
    from weights import Lockfile, WeightsError, verify_tree
    from weights.signing import verify_signature

    problems: list[str] = []
    models: dict[str, Any] = {}
    try:
        lock = Lockfile.load(i.lockfile)
        for entry in lock.entries:
            rep = verify_tree(Path(i.weights_dir), entry)
            models[entry.repo_id] = {"commit": entry.commit, "files": rep.checked,
                                     "ok": rep.ok, "signature": None}
            if not rep.ok:
                cache = "".join(
                    [f"; {m.path} " + ("is absent" if m.actual == "absent" else
                                       f"names {m.actual.removeprefix('commit:')[:40]!r}, "
                                       "not the pinned commit") for m in rep.refs]
                    + [f"; other snapshot {s}" for s in rep.extra_snapshots])
                problems.append(f"{entry.repo_id}: differs from the lockfile ({len(rep.mismatched)}"
                                f" changed, {len(rep.missing)} missing, {len(rep.extra)} extra)"
                                + cache)
                continue
            if i.weights_signature is None or i.weights_public_key is None:
                problems.append(f"{entry.repo_id}: no signature checked (--weights-signature, "
                                "--weights-public-key)")
                continue
            verify_signature(rep.root, i.weights_signature, public_key=i.weights_public_key,
                             digests=rep.digests)
            models[entry.repo_id]["signature"] = "verified"
    except WeightsError as exc:
        problems.append(str(exc))
    evidence = {"lockfile": str(i.lockfile), "lockfile_sha256": _file_sha256(i.lockfile),
                "signature": str(i.weights_signature) if i.weights_signature else None,
                "signature_sha256": _file_sha256(i.weights_signature),
                "signer_key_sha256": _key_fingerprint(i.weights_public_key),
                "models": models}
    match = "matches" if len(models) == 1 else "match"
    return outcome(cid, title, problems, f"{counted(len(models), 'model')} {match} the lockfile "
                   "and a verified signature", evidence, crit)
