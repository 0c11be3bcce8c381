"""What the policy does with findings: first matching rule, classes raised, fail-safe."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from policy import PiiRefused, PiiScanFailed, Policy
from policy.pii import Detector, PiiPolicy

POLICY = """\
version: 1
data_classes: [public, internal, confidential, personal]
pii:
  default_class: personal
  entity_classes: {EMAIL_ADDRESS: internal}
  fail_closed_classes: [confidential]
  rules:
    - {id: lab-records, keys: [k-lab], action: record}
    - {id: no-cards-for-public, classes: [public], entities: [CREDIT_CARD], action: refuse}
    - {id: mask-mail, teams: [support], entities: [EMAIL_ADDRESS], action: mask}
"""
IBAN = "DE89370400440532013000"


@pytest.fixture(scope="module")
def pii() -> PiiPolicy:
    policy = Policy.from_text(POLICY)
    assert policy.pii is not None
    return policy.pii


def test_a_finding_raises_the_class_to_the_one_its_entity_implies(pii: PiiPolicy) -> None:
    v = pii.inspect("mail a@example.org", "k", None, "public")
    assert (v.class_after, v.actions) == ("internal", {"EMAIL_ADDRESS": "raise"})
    v = pii.inspect(f"mail a@example.org, IBAN {IBAN}", "k", None, "public")
    assert v.class_after == "personal"
    v = pii.inspect(f"IBAN {IBAN}", "k", None, "personal")  # never lowered
    assert v.class_after == "personal"


def test_the_first_rule_that_applies_decides(pii: PiiPolicy) -> None:
    v = pii.inspect("card 4111111111111111", "k-lab", None, "public")
    assert (v.actions, v.rules, v.class_after) == (
        {"CREDIT_CARD": "record"}, {"CREDIT_CARD": "lab-records"}, "public")
    with pytest.raises(PiiRefused) as info:
        pii.inspect("card 4111111111111111", "k", None, "public")
    assert info.value.entities == ("CREDIT_CARD",) and "4111" not in str(info.value)
    v = pii.inspect("card 4111111111111111", "k", None, "internal")  # rule is for public only
    assert (v.actions, v.class_after) == ({"CREDIT_CARD": "raise"}, "personal")
    v = pii.inspect("mail a@example.org", "k", "support", "public")
    assert (v.actions, v.class_after) == ({"EMAIL_ADDRESS": "mask"}, "public")
    assert PiiPolicy.masked("mail a@example.org", v) == "mail <EMAIL_ADDRESS>"


class _Broken(Detector):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def scan(self, value: Any) -> list[Any]:
        raise RuntimeError("detector bug")


def test_a_detector_error_is_decided_as_if_every_entity_was_found() -> None:
    """Fail-safe: confidential fails closed; public may have held a card, which its rule
    refuses (cannot be checked unscanned); internal is raised to the most sensitive class a
    ``raise`` could give; the lab's key only records."""
    policy = Policy.from_text(POLICY)
    assert policy.pii is not None
    broken = PiiPolicy(policy.pii.section, policy.classes, detector_factory=_Broken)
    with pytest.raises(PiiScanFailed):
        broken.inspect(f"IBAN {IBAN}", "k", None, "confidential")
    with pytest.raises(PiiScanFailed) as info:
        broken.inspect(f"IBAN {IBAN}", "k", None, "public")
    assert "CREDIT_CARD" in info.value.message and IBAN not in info.value.message
    v = broken.inspect(f"IBAN {IBAN}", "k", None, "internal")
    assert (v.error, v.class_before, v.class_after, v.findings) == (
        "scan failed (RuntimeError)", "internal", "personal", ())
    v = broken.inspect(f"IBAN {IBAN}", "k-lab", None, "public")
    assert (v.error, v.class_after) == ("scan failed (RuntimeError)", "public")
    with pytest.raises(PiiScanFailed):  # support masks e-mail addresses
        broken.inspect("x", "k", "support", "internal")
    with pytest.raises(PiiScanFailed):
        asyncio.run(broken.inspect_async(f"IBAN {IBAN}", "k", None, "confidential"))
