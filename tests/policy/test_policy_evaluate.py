"""Rule evaluation: allow, deny, no match, first match, constraints, data class changes."""

from __future__ import annotations

import logging

import pytest
from policy_testdata import BASE

from policy import (
    ClassChangeForbidden,
    Policy,
    Principal,
    UnknownDataClass,
    UnknownDestination,
)

ALICE = Principal("k-alice", "engineering")


def test_public_allowed_anywhere(policy: Policy) -> None:
    for dest in ("vllm-eu-a", "vllm-eu-b", "provider-us"):
        d = policy.evaluate(ALICE, "public", dest)
        assert d.allowed and d.rule_id == "public-anywhere" and d.revision == policy.revision


def test_confidential_only_eu_with_no_retention(policy: Policy) -> None:
    ok = policy.evaluate(ALICE, "confidential", "vllm-eu-a")
    assert ok.allowed and ok.rule_id == "sensitive-eu-no-retention"
    tag = policy.evaluate(ALICE, "confidential", "vllm-eu-b")
    assert not tag.allowed and tag.rule_id == "sensitive-eu-no-retention"
    assert "lacks no-retention" in tag.reason
    jur = policy.evaluate(ALICE, "personal", "provider-us")
    assert not jur.allowed and jur.rule_id == "sensitive-eu-no-retention"
    assert "requires jurisdiction EU; provider-us is non-EU" in jur.reason


def test_region_and_operator_constraints() -> None:
    p = Policy.from_text(BASE.replace(
        "constraints: {jurisdiction: EU}",
        "constraints: {regions: [eu-fr-1], operators: [acme]}",
    ))
    assert p.evaluate(ALICE, "internal", "vllm-eu-b").allowed
    d = p.evaluate(ALICE, "internal", "vllm-eu-a")
    assert not d.allowed and d.rule_id == "internal-eu" and "region in [eu-fr-1]" in d.reason
    d = p.evaluate(ALICE, "internal", "provider-us")
    assert not d.allowed and "region" in d.reason


def test_explicit_deny_comes_first(policy: Policy) -> None:
    d = policy.evaluate(Principal("k-bob", "contractors"), "public", "vllm-eu-a")
    assert not d.allowed and d.rule_id == "block-contractor"


def test_first_match_order_decides() -> None:
    # Moving the broad rule first makes it shadow the constrained one.
    broad = "  - id: everything\n"
    reordered = BASE.replace("rules:\n", "rules:\n" + broad)
    p = Policy.from_text(reordered)
    d = p.evaluate(ALICE, "personal", "provider-us")
    assert d.allowed and d.rule_id == "everything"
    assert not Policy.from_text(BASE + broad).evaluate(ALICE, "personal", "provider-us").allowed


def test_no_rule_matched() -> None:
    only_x = "classes: [public]\n    principals: {keys: [k-x]}\n"
    p = Policy.from_text(BASE.replace("classes: [public]\n", only_x))
    d = p.evaluate(ALICE, "public", "vllm-eu-a")
    assert not d.allowed and d.rule_id is None and d.reason.startswith("no rule matched")
    assert p.evaluate(Principal("k-x"), "public", "vllm-eu-a").allowed


def test_principal_selectors_match_key_or_team() -> None:
    p = Policy.from_text(BASE.replace(
        "classes: [public]\n", "classes: [public]\n    principals: {keys: [k-x], teams: [t]}\n"
    ))
    assert p.evaluate(Principal("k-x", None), "public", "vllm-eu-a").allowed
    assert p.evaluate(Principal("k-y", "t"), "public", "vllm-eu-a").allowed
    assert not p.evaluate(Principal("k-y", "u"), "public", "vllm-eu-a").allowed


def test_non_inference_destinations_never_receive_prompts(policy: Policy) -> None:
    d = policy.evaluate(ALICE, "public", "audit-db")
    assert not d.allowed and d.rule_id is None and "purpose 'audit'" in d.reason


def test_unknown_destination_and_class(policy: Policy) -> None:
    d = policy.evaluate(ALICE, "public", "nowhere")
    assert not d.allowed and "not defined" in d.reason
    with pytest.raises(UnknownDestination):
        policy.destination("nowhere")
    with pytest.raises(UnknownDataClass):
        policy.evaluate(ALICE, "secret", "vllm-eu-a")


def test_decisions_are_cached_per_revision(policy: Policy) -> None:
    first = policy.evaluate(ALICE, "internal", "vllm-eu-a")
    assert policy.evaluate(ALICE, "internal", "vllm-eu-a") is first
    flipped = BASE.replace("{jurisdiction: EU}", "{jurisdiction: non-EU}")
    other = Policy.from_text(flipped)
    d = other.evaluate(ALICE, "internal", "vllm-eu-a")
    assert not d.allowed and d.revision != first.revision


def test_unsafe_allow_all_allows_and_warns_every_time(caplog: pytest.LogCaptureFixture) -> None:
    p = Policy.from_text(BASE + "unsafe_allow_all: true\n")
    caplog.set_level(logging.WARNING, logger="policy.evaluate")
    for _ in range(3):
        d = p.evaluate(Principal("k-bob", "contractors"), "personal", "provider-us")
        assert d.allowed and d.rule_id == "unsafe_allow_all"
    assert sum("unsafe_allow_all" in r.getMessage() for r in caplog.records) == 3


def test_explain_lists_every_inference_destination(policy: Policy) -> None:
    got = {d.destination_id: (d.allowed, d.rule_id) for d in policy.explain(ALICE, "confidential")}
    assert got == {
        "vllm-eu-a": (True, "sensitive-eu-no-retention"),
        "vllm-eu-b": (False, "sensitive-eu-no-retention"),
        "provider-us": (False, "sensitive-eu-no-retention"),
    }


def test_record_shape(policy: Policy) -> None:
    rec = policy.evaluate(ALICE, "public", "vllm-eu-a").as_record()
    assert rec == {
        "decision": "allow", "rule_id": "public-anywhere",
        "reason": "allowed by rule public-anywhere", "policy_revision": policy.revision,
        "destination": "vllm-eu-a",
    }


# --- data classes ------------------------------------------------------------------------------

def test_default_class_without_header(policy: Policy) -> None:
    assert policy.resolve_class("confidential", None, ALICE) == "confidential"
    assert policy.resolve_class("confidential", "  ", ALICE) == "confidential"
    assert policy.resolve_class("confidential", "Confidential", ALICE) == "confidential"


def test_lowering_without_grant_is_refused(policy: Policy) -> None:
    with pytest.raises(ClassChangeForbidden) as info:
        policy.resolve_class("confidential", "public", ALICE)
    assert info.value.code == "class_change_forbidden"
    assert "may not lower" in str(info.value)


def test_raising_without_grant_is_refused(policy: Policy) -> None:
    with pytest.raises(ClassChangeForbidden, match="may not raise"):
        policy.resolve_class("public", "personal", ALICE)


def test_grant_allows_only_its_classes_and_direction(policy: Policy) -> None:
    research = Principal("k-r", "research")
    assert policy.resolve_class("confidential", "internal", research) == "internal"
    with pytest.raises(ClassChangeForbidden):
        policy.resolve_class("confidential", "public", research)  # not in grant's classes
    with pytest.raises(ClassChangeForbidden):
        policy.resolve_class("public", "internal", research)  # lower-only grant
    assert policy.resolve_class("public", "personal", Principal("k-raise")) == "personal"


def test_unknown_classes_are_refused(policy: Policy) -> None:
    with pytest.raises(UnknownDataClass):
        policy.resolve_class("public", "top-secret", ALICE)
    with pytest.raises(UnknownDataClass):
        policy.resolve_class("nope", None, ALICE)


def test_select_over_a_models_replicas(policy: Policy) -> None:
    sel = policy.select(ALICE, "confidential", ["vllm-eu-b", "vllm-eu-a", None, "provider-us"])
    assert sel.allowed == (1,) and sel.rule_id == "sensitive-eu-no-retention" and sel.reason == ""
    assert [d.allowed for d in sel.decisions] == [False, True, False, False]
    assert sel.decisions[2].reason == "replica has no policy destination"
    denied = policy.select(ALICE, "personal", ["vllm-eu-b", "provider-us"])
    assert denied.allowed == () and denied.rule_id == "sensitive-eu-no-retention"
    assert "lacks no-retention" in denied.reason
    nomatch = policy.select(Principal("k", "contractors"), "public", ["vllm-eu-a"])
    assert nomatch.allowed == () and nomatch.rule_id == "block-contractor"
    assert policy.select(ALICE, "public", []).reason == "model has no replicas"
