"""Object keys are scanned, and a finding's path never carries a key's text unless the key is
a plain identifier without a finding of its own (policy.pii.engine's path form)."""

from __future__ import annotations

import json

import pytest

from policy import PiiRefused, Policy
from policy.pii import Detector, PiiPolicy
from policy.pii.engine import iter_strings, mask

CARD = "4111 1111 1111 1111"
IBAN = "DE89370400440532013000"  # also a plain identifier: letters, then digits
MAIL = "jane@example.org"


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector()


def _policy(rules: str) -> PiiPolicy:
    policy = Policy.from_text(f"version: 1\ndata_classes: [public, personal]\npii:\n"
                              f"  default_class: personal\n  rules:\n{rules}")
    assert policy.pii is not None
    return policy.pii


def test_a_key_is_scanned_and_its_path_marks_it_as_a_key(detector: Detector) -> None:
    found = detector.scan({"text": "hello", CARD: "x"})
    assert [(f.entity, f.path, f.key) for f in found] == [("CREDIT_CARD", "{key#1}", True)]
    found = detector.scan({"arguments": {"note": "x", f"mail {MAIL}": "v"}})
    assert [(f.entity, f.path) for f in found] == [("EMAIL_ADDRESS", "arguments.{key#1}")]
    assert f"mail {MAIL}"[found[0].start:found[0].end] == MAIL
    assert detector.scan({CARD: "x"}, keys=False) == []


def test_a_path_writes_only_plain_identifier_keys_without_findings(detector: Detector) -> None:
    value = {"note": f"IBAN {IBAN}", "a key with spaces": f"IBAN {IBAN}",
             "k" * 65: f"IBAN {IBAN}", "ok_1": [f"IBAN {IBAN}"],
             IBAN: f"mail {MAIL}"}  # a plain identifier, but a finding itself
    found = detector.scan(value)
    assert [(f.entity, f.path) for f in found] == [
        ("IBAN_CODE", "note"), ("IBAN_CODE", "{#1}"), ("IBAN_CODE", "{#2}"),
        ("IBAN_CODE", "ok_1[0]"), ("IBAN_CODE", "{key#4}"), ("EMAIL_ADDRESS", "{#4}")]
    records = json.dumps([f.as_record() for f in found])
    assert IBAN not in records and "spaces" not in records and "k" * 65 not in records
    assert [f.as_record().get("key") for f in found] == [None] * 4 + [True, None]


def test_iter_strings_yields_keys_before_their_values() -> None:
    png = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"  # binary: not scanned
    assert list(iter_strings({"a b": {"c": "x"}, "d": png})) == [
        ("{key#0}", "a b"), ("{#0}.{key#0}", "c"), ("{#0}.c", "x"), ("{key#1}", "d")]
    assert list(iter_strings({"a b": "x"}, keys=False)) == [("{#0}", "x")]


def test_mask_finds_a_value_under_a_key_that_held_a_finding(detector: Detector) -> None:
    value = {"args": {IBAN: f"mail {MAIL}", "other": "keep"}}
    found = detector.scan(value)
    masked = mask(value, [f for f in found if not f.key])
    assert masked == {"args": {IBAN: "mail <EMAIL_ADDRESS>", "other": "keep"}}
    with pytest.raises(ValueError, match="object key"):
        mask(value, found)


def test_mask_on_a_key_fails_closed_and_the_record_keeps_no_key_text() -> None:
    pii = _policy("    - {id: mask-all, action: mask}\n")
    args = {"text": f"mail {MAIL}", f"card {CARD}": "x"}
    with pytest.raises(PiiRefused) as info:
        pii.inspect(args, "k", None, "public")
    exc = info.value
    assert exc.in_key and exc.entities == ("CREDIT_CARD",)
    assert "argument name" in exc.message and "4111" not in exc.message
    verdict = exc.verdict
    assert verdict is not None and hasattr(verdict, "as_record")
    record = verdict.as_record()
    assert record["actions"] == {"EMAIL_ADDRESS": "mask", "CREDIT_CARD": "refuse"}
    assert record["in_keys"] == {"CREDIT_CARD": 1}
    assert "4111" not in json.dumps(record) and MAIL not in json.dumps(record)
    # A value alone is still masked, not refused.
    v = pii.inspect({"text": f"card {CARD}"}, "k", None, "public")
    assert PiiPolicy.masked({"text": f"card {CARD}"}, v) == {"text": "card <CREDIT_CARD>"}


@pytest.mark.parametrize("action, outcome", [("refuse", "refused"), ("raise", "personal"),
                                             ("record", "public")])
def test_a_finding_in_a_key_meets_the_rule_like_a_value(action: str, outcome: str) -> None:
    pii = _policy(f"    - {{id: r, entities: [CREDIT_CARD], action: {action}}}\n")
    args = {CARD: "x"}
    if outcome == "refused":
        with pytest.raises(PiiRefused) as info:
            pii.inspect(args, "k", None, "public")
        assert info.value.entities == ("CREDIT_CARD",) and not info.value.in_key
        return
    v = pii.inspect(args, "k", None, "public")
    assert v.class_after == outcome and v.as_record()["in_keys"] == {"CREDIT_CARD": 1}
