"""``policy explain --text``: the effect of a sample prompt's sensitive data on routing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from policy_testdata import BASE

from policy.cli import main

PII = """\
pii:
  default_class: personal
  rules:
    - {id: no-cards, entities: [CREDIT_CARD], action: refuse}
    - {id: lab-masks, keys: [k-lab], action: mask}
"""
ALL = ["--destination", "vllm-eu-a", "--destination", "vllm-eu-b", "--destination",
       "provider-us"]


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(BASE + PII)
    return path


def _explain(capsys: pytest.CaptureFixture[str], policy_file: Path, key: str,
             text: str) -> tuple[int, dict]:
    code = main(["explain", str(policy_file), "--key", key, "--class", "public", "--text", text,
                 *ALL, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_an_iban_raises_a_public_request_to_where_personal_may_go(
        policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _explain(capsys, policy_file, "k-pub", "pay to DE89 3704 0044 0532 0130 00")
    assert code == 0
    assert out["data_class"] == "personal"
    assert out["allowed"] == ["vllm-eu-a"]
    assert out["pii"]["entities"] == {"IBAN_CODE": 1}
    assert out["pii"]["class_before"] == "public"
    code, out = _explain(capsys, policy_file, "k-pub", "pay the usual account")
    assert (code, out["data_class"]) == (0, "public")
    assert sorted(out["allowed"]) == ["provider-us", "vllm-eu-a", "vllm-eu-b"]


def test_a_refused_entity_and_a_masked_one_are_shown(
        policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _explain(capsys, policy_file, "k-pub", "card 4111 1111 1111 1111")
    assert code == 1
    assert out["pii"]["refused"] == ["CREDIT_CARD"]
    code, out = _explain(capsys, policy_file, "k-lab", "mail jane@example.org")
    assert code == 0 and out["data_class"] == "public"
    assert out["pii"]["forwarded_text"] == "mail <EMAIL_ADDRESS>"


def test_the_table_output_names_entities_actions_and_classes(
        policy_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain", str(policy_file), "--key", "k-pub", "--class", "public", "--text",
                 "IBAN DE89370400440532013000, card 4111111111111111", *ALL])
    out = capsys.readouterr().out
    assert code == 1
    assert "IBAN_CODE x1 -> raise" in out and "CREDIT_CARD x1 -> refuse (rule no-cards)" in out
    assert "403 pii_refused naming CREDIT_CARD" in out
