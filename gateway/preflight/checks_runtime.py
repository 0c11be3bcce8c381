"""Policy, running-gateway, audit-log and weights checks.

Policy checks use the ``policy`` package's public API only (``Policy.destinations``,
``Policy.evaluate``, ``Policy.unsafe_allow_all``); audit checks use ``gateway.audit``'s
public API (``open_store``, ``verify_store``, ``load_verifier``, ``open_checkpoint``); the
weights check uses ``weights.verify_tree`` and ``weights.signing.verify_signature``.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any

from clishell.text import counted
from gateway.preflight.inputs import Facts, run_async
from gateway.preflight.report import CheckResult

__all__ = ["RETENTION_MIN_DAYS", "check_allow_all", "check_audit_log", "check_checkpoint",
           "check_destinations", "check_guard", "check_retention", "check_signing_key",
           "check_unsafe", "check_weights"]

#: AI Act Art. 26(6): "at least six months"; 183 days covers every six-month span.
RETENTION_MIN_DAYS = 183
_PRIVATE_KEY = re.compile(r"PRIVATE\+KEY\+|-----BEGIN [A-Z ]*PRIVATE KEY-----")


def _skip(cid: str, title: str, why: str, crit: tuple[str, ...]) -> CheckResult:
    return CheckResult(cid, title, "skip", why, {}, crit)


def _result(cid: str, title: str, problems: list[str], ok: str, evidence: dict[str, Any],
            crit: tuple[str, ...]) -> CheckResult:
    if problems:
        return CheckResult(cid, title, "fail", "; ".join(problems), evidence, crit)
    return CheckResult(cid, title, "pass", ok, evidence, crit)


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
        return _skip(cid, title, "no policy or gateway config given", crit)
    if not c.regions:
        return _skip(cid, title, "no allowed regions given (--region)", crit)
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
    return _result(cid, title, problems, f"{counted(len(where), 'destination')}, all in "
                   f"{', '.join(c.regions)} ({', '.join(c.jurisdictions)})", evidence, crit)


def check_allow_all(facts: Facts) -> CheckResult:
    """No allow rule without principals, classes, destinations and constraints."""
    cid, title, crit = ("policy.no-allow-all", "no rule allows everything", ("SOV-3",))
    if facts.policy is None:
        return _skip(cid, title, "no policy or gateway config given", crit)
    wide = [r.id for r in facts.policy.document.rules
            if r.effect == "allow" and not r.principals.keys and not r.principals.teams
            and r.classes is None and r.destinations is None
            and r.constraints.jurisdiction is None and r.constraints.regions is None
            and not r.constraints.require_tags and r.constraints.operators is None]
    evidence = {"rules": [r.id for r in facts.policy.document.rules], "allow_everything": wide}
    return _result(cid, title, [f"rule {r} allows every key, class and destination"
                                for r in wide], "no unrestricted allow rule", evidence, crit)


def check_unsafe(facts: Facts) -> CheckResult:
    """The ``unsafe_allow_all`` switch is off (in the file and, if given, the running policy)."""
    cid, title, crit = ("policy.unsafe-off", "the unsafe allow-all switch is off", ("SOV-3",))
    running = (facts.status or {}).get("policy") or {}
    if facts.policy is None and not running:
        return _skip(cid, title, "no policy, config or running gateway given", crit)
    problems = []
    if facts.policy is not None and facts.policy.unsafe_allow_all:
        problems.append(f"unsafe_allow_all is on in {facts.policy.source}")
    if running.get("unsafe_allow_all"):
        problems.append("unsafe_allow_all is on in the running gateway")
    evidence = {"file": facts.policy.unsafe_allow_all if facts.policy is not None else None,
                "running": running.get("unsafe_allow_all")}
    return _result(cid, title, problems, "unsafe_allow_all is off", evidence, crit)


def check_guard(facts: Facts) -> CheckResult:
    """The running gateway's guard enforces on the standard loop; self-test passed."""
    cid, title, crit = ("gateway.guard", "process guard in enforce mode on the standard loop, "
                        "self-test passed", ("SOV-3", "SOV-7"))
    st = facts.status
    if st is None:
        return _skip(cid, title, "no running gateway given (--admin-url)", crit)
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
    return _result(cid, title, problems, f"enforce on {loop}, self-test passed", evidence, crit)


def _audit_settings(facts: Facts) -> Any:
    from gateway.audit import AuditSettings

    section = getattr(facts.settings, "audit", None)
    if section is None:
        return None
    return AuditSettings.model_validate(dict(section))


def check_audit_log(facts: Facts) -> CheckResult:
    """The audit store verifies (hash chains, Merkle checkpoints, signatures)."""
    from gateway.audit import AuditError, load_verifier, open_store, verify_store

    cid, title, crit = ("audit.verify", "the audit log verifies", ("AIA-12", "SOV-7"))
    if facts.settings is None:
        return _skip(cid, title, "no gateway config given", crit)
    a = _audit_settings(facts)
    if a is None or not a.enabled:
        return CheckResult(cid, title, "fail", "the audit log is not enabled in the config",
                           {}, crit)
    key = facts.inputs.audit_public_key
    if key is None:
        return _skip(cid, title, "no audit public key given (--audit-public-key)", crit)

    async def run() -> Any:
        store = open_store(a.store_url(), read_only=True)
        await store.open()
        try:
            return store.display_url, await verify_store(
                store, verifiers=[load_verifier(key)], checkpoint_dir=a.checkpoint_dir)
        finally:
            await store.close()

    try:
        url, report = run_async(run())
    except AuditError as exc:
        return CheckResult(cid, title, "fail", f"cannot verify: {exc}", {}, crit)
    evidence = {"store": url, "report": report.to_dict()}
    problems = [str(f) for f in report.errors]
    verify = "verifies" if len(report.chains) == 1 else "verify"
    return _result(cid, title, problems[:5], f"{counted(len(report.chains), 'chain')} {verify} "
                   f"with {key.name}", evidence, crit)


def latest_checkpoint(facts: Facts) -> dict[str, Any] | None:
    """The newest signed checkpoint: from the running gateway, else from the configured store."""
    from gateway.preflight.status import audit_state

    st = (facts.status or {}).get("audit") or {}
    if st.get("last_checkpoint"):
        return {**st["last_checkpoint"], "heartbeat_s": st.get("heartbeat_s"),
                "from": "running gateway"}
    if facts.settings is not None and getattr(facts.settings, "audit", None) is not None:
        state = run_async(audit_state(facts.settings.audit))
        if state.get("last_checkpoint"):
            return {**state["last_checkpoint"], "heartbeat_s": state.get("heartbeat_s"),
                    "from": "audit store"}
    return None


def check_checkpoint(facts: Facts, now_s: float | None = None) -> CheckResult:
    """The newest checkpoint is younger than twice the heartbeat and its signature verifies."""
    from gateway.audit import AuditError, load_verifier, open_checkpoint

    cid, title, crit = ("audit.checkpoint-fresh", "the newest signed checkpoint is within the "
                        "heartbeat", ("AIA-12", "SOV-7"))
    if facts.status is None and facts.settings is None:
        return _skip(cid, title, "no running gateway or gateway config given", crit)
    running_audit = (facts.status or {}).get("audit") or {}
    if facts.status is not None and not running_audit.get("enabled"):
        return CheckResult(cid, title, "fail", "the running gateway has no audit log",
                           {"audit": running_audit}, crit)
    cp = latest_checkpoint(facts)
    if cp is None:
        return CheckResult(cid, title, "fail", "no signed checkpoint found",
                           {"audit": running_audit}, crit)
    now = time.time() if now_s is None else now_s
    age_s = now - cp["ts_us"] / 1e6
    bound = 2 * float(cp.get("heartbeat_s") or 60.0)
    problems = []
    if age_s > bound:
        problems.append(f"newest checkpoint is {age_s:.0f} s old (bound {bound:.0f} s = 2 x "
                        "heartbeat)")
    signature = "not checked (no --audit-public-key)"
    if facts.inputs.audit_public_key is not None:
        try:
            open_checkpoint(cp["note"], [load_verifier(facts.inputs.audit_public_key)])
            signature = "verified"
        except AuditError as exc:
            problems.append(f"checkpoint signature: {exc}")
            signature = "bad"
    evidence = {"chain": cp["chain"], "size": cp["size"], "age_s": round(age_s, 1),
                "bound_s": bound, "signature": signature, "from": cp["from"]}
    return _result(cid, title, problems, f"checkpoint of {cp['chain']} is {age_s:.0f} s old "
                   f"(bound {bound:.0f} s), signature {signature}", evidence, crit)


def _gateway_workloads(facts: Facts) -> list[Any]:
    return [w for w in facts.workloads or ()
            if w.labels.get("app.kubernetes.io/component") == "gateway"]


def _secret_volume(volume: dict[str, Any]) -> bool:
    if "secret" in volume:
        return True
    sources = (volume.get("projected") or {}).get("sources") or ()
    return bool(sources) and all("secret" in s for s in sources)


def check_signing_key(facts: Facts) -> CheckResult:
    """The audit signing key is mounted from a Secret, and no private key is in the values."""
    cid, title, crit = ("audit.signing-key", "the audit signing key comes from a Secret, not "
                        "from values", ("AIA-12", "SOV-7"))
    gws = _gateway_workloads(facts)
    if not gws:
        return _skip(cid, title, "no Helm values, manifests or kubeconfig with gateway pods",
                     crit)
    a = _audit_settings(facts) if facts.settings is not None else None
    key_path = str(a.signing_key_file) if a is not None else None
    problems, mounts = [], {}
    for w in gws:
        found = False
        for vol in w.volumes:
            for path in w.mounts.get(str(vol.get("name")), []):
                hit = (key_path.startswith(path.rstrip("/") + "/") or key_path == path
                       if key_path else "audit-key" in path)
                if hit:
                    mounts[f"{w.name}:{path}"] = "secret" if _secret_volume(vol) else "other"
                    found = found or _secret_volume(vol)
        if not found:
            problems.append(f"{w.name}: no Secret volume holds the audit signing key")
    if facts.values_text is not None and _PRIVATE_KEY.search(facts.values_text):
        problems.append("the Helm values contain private key material")
    evidence = {"signing_key_file": key_path, "mounts": mounts,
                "values_scanned": facts.values_text is not None}
    return _result(cid, title, problems, "signing key mounted from a Secret; none in values",
                   evidence, crit)


def check_retention(facts: Facts, now_s: float | None = None) -> CheckResult:
    """Declared retention >= 6 months; a SQLite store sits on a persistent volume; with the
    config's store, no deleted record may be younger than the retention.
    """
    cid, title, crit = ("audit.retention", "audit log retention is at least six months",
                        ("AIA-26(6)",))
    days = facts.criteria.retention_days
    if days is None:
        return _skip(cid, title, "no retention declared (--retention-days)", crit)
    problems = []
    if days < RETENTION_MIN_DAYS:
        problems.append(f"declared retention {days} days < {RETENTION_MIN_DAYS} (six months)")
    storage: dict[str, str] = {}
    for w in _gateway_workloads(facts):
        for vol in w.volumes:
            if vol.get("name") == "audit":
                kind = "persistentVolumeClaim" if "persistentVolumeClaim" in vol else next(
                    (k for k in vol if k != "name"), "unknown")
                storage[w.name] = kind
                if kind != "persistentVolumeClaim":
                    problems.append(f"{w.name}: audit store volume is {kind}, not a "
                                    "PersistentVolumeClaim (lost with the pod)")
    evidence = {"declared_days": days, "minimum_days": RETENTION_MIN_DAYS,
                "audit_volumes": storage}
    store = _store_retention(facts, days, problems, now_s)
    if store is not None:
        evidence["store"] = store
    return _result(cid, title, problems, f"declared retention {days} days >= "
                   f"{RETENTION_MIN_DAYS}", evidence, crit)


def _store_retention(facts: Facts, days: int, problems: list[str],
                     now_s: float | None) -> dict[str, Any] | None:
    """Pruned records younger than the declared retention fail (AI Act Art. 26(6))."""
    from gateway.audit import AuditError, open_store
    from gateway.audit.retention import retention_state

    a = _audit_settings(facts) if facts.settings is not None else None
    if a is None or not a.enabled:
        return None

    async def run() -> Any:
        store = open_store(a.store_url(), read_only=True)
        await store.open()
        try:
            return await retention_state(store)
        finally:
            await store.close()

    try:
        state = run_async(run())
    except AuditError as exc:
        problems.append(f"cannot read the audit store's oldest record: {exc}")
        return None
    now = time.time() if now_s is None else now_s
    age_days = None if state.oldest_us is None else (now - state.oldest_us / 1e6) / 86400
    # The deleted records are older than the bound of their own sign only: another chain's
    # old records say nothing about them.
    young = [line for line, bound in zip(state.pruned, state.pruned_bounds_us, strict=True)
             if (now - bound / 1e6) / 86400 < days]
    if young:
        problems.append(f"records were deleted that may be younger than the declared {days} "
                        "days: " + "; ".join(young[:3]))
    return {**state.to_dict(), "oldest_age_days": None if age_days is None
            else round(age_days, 3)}


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
        return _skip(cid, title, "no --lockfile and --weights given", crit)
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
                problems.append(f"{entry.repo_id}: differs from the lockfile ({len(rep.mismatched)}"
                                f" changed, {len(rep.missing)} missing, {len(rep.extra)} extra)")
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
    return _result(cid, title, problems, f"{counted(len(models), 'model')} {match} the lockfile "
                   "and a verified signature", evidence, crit)
