"""Audit-log checks: the store verifies, its newest checkpoint is fresh and signed, the signing
key is kept out of the pods' environment and images, and records are kept long enough.

They use ``gateway.audit``'s public API (``open_store``, ``verify_store``, ``load_verifier``,
``open_checkpoint``).
"""

from __future__ import annotations

import re
import time
from typing import Any

from clishell.text import counted
from gateway.preflight.inputs import Facts, run_async
from gateway.preflight.report import CheckResult, outcome, skipped

__all__ = ["RETENTION_MIN_DAYS", "check_audit_log", "check_checkpoint", "check_retention",
           "check_signing_key", "latest_checkpoint"]

#: AI Act Art. 26(6): "at least six months"; 183 days covers every six-month span.
RETENTION_MIN_DAYS = 183
_PRIVATE_KEY = re.compile(r"PRIVATE\+KEY\+|-----BEGIN [A-Z ]*PRIVATE KEY-----")


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
        return skipped(cid, title, "no gateway config given", crit)
    a = _audit_settings(facts)
    if a is None or not a.enabled:
        return CheckResult(cid, title, "fail", "the audit log is not enabled in the config",
                           {}, crit)
    key = facts.inputs.audit_public_key
    if key is None:
        return skipped(cid, title, "no audit public key given (--audit-public-key)", crit)

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
    return outcome(cid, title, problems[:5], f"{counted(len(report.chains), 'chain')} {verify} "
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
        return skipped(cid, title, "no running gateway or gateway config given", crit)
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
    return outcome(cid, title, problems, f"checkpoint of {cp['chain']} is {age_s:.0f} s old "
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
        return skipped(cid, title, "no Helm values, manifests or kubeconfig with gateway pods",
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
    return outcome(cid, title, problems, "signing key mounted from a Secret; none in values",
                   evidence, crit)


def check_retention(facts: Facts, now_s: float | None = None) -> CheckResult:
    """Declared retention >= 6 months; a SQLite store sits on a persistent volume; with the
    config's store, no deleted record may be younger than the retention.
    """
    cid, title, crit = ("audit.retention", "audit log retention is at least six months",
                        ("AIA-26(6)",))
    days = facts.criteria.retention_days
    if days is None:
        return skipped(cid, title, "no retention declared (--retention-days)", crit)
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
    return outcome(cid, title, problems, f"declared retention {days} days >= "
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
