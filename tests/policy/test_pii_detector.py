"""The detector: EU identifiers found by Presidio offline, located in JSON, masked, measured."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from bench.pii_corpus import generate, score
from policy import Policy, PolicyFileError
from policy.pii import Detector, mask, scan


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector()


@pytest.mark.parametrize(("text", "entity", "match"), [
    ("My IBAN is DE89 3704 0044 0532 0130 00, thanks", "IBAN_CODE",
     "DE89 3704 0044 0532 0130 00"),
    ("IBAN:NL91ABNA0417164300.", "IBAN_CODE", "NL91ABNA0417164300"),
    ("card 4111-1111-1111-1111 exp 12/27", "CREDIT_CARD", "4111-1111-1111-1111"),
    ("write to jane.doe@example.org today", "EMAIL_ADDRESS", "jane.doe@example.org"),
    ("call me on +49 30 901820", "PHONE_NUMBER", "+49 30 901820"),
    ("the box at 192.168.10.4 answers", "IP_ADDRESS", "192.168.10.4"),
    ("the box at 2001:db8::42 answers", "IP_ADDRESS", "2001:db8::42"),
    ("Steuer-ID: 86 095 742 719", "DE_TAX_ID", "86 095 742 719"),
    ("NIR 2 55 08 14 168 025 38", "FR_NIR", "2 55 08 14 168 025 38"),
    ("codice fiscale RSSMRA85T10A562S", "IT_FISCAL_CODE", "RSSMRA85T10A562S"),
    ("DNI 12345678-Z", "ES_NIF", "12345678-Z"),
    ("NIE X-1234567-L", "ES_NIE", "X-1234567-L"),
    ("BSN 1112.22.333", "NL_BSN", "1112.22.333"),
    ("PESEL 44051401359", "PL_PESEL", "44051401359"),
    ("USt-IdNr DE136695976", "EU_VAT_ID", "DE136695976"),
])
def test_each_identifier_is_found_with_its_span(detector: Detector, text: str, entity: str,
                                                match: str) -> None:
    found = detector.scan(text)
    assert [(f.entity, text[f.start:f.end]) for f in found] == [(entity, match)]


@pytest.mark.parametrize("text", [
    "My IBAN is DE89 3704 0044 0532 0130 01, thanks",   # wrong check digits
    "card 4111-1111-1111-1112",                           # Luhn fails
    "order 86095742719 shipped",                          # tax-id check passes, no context
    "BSN 111222334",                                      # elfproef fails
    "version 12:30:45 and 1.2.3",                         # neither IPv6 nor IPv4
    "codice fiscale RSSMRA85T10A562T",                    # wrong check letter
])
def test_wrong_check_digits_and_bare_numbers_are_not_findings(detector: Detector,
                                                                text: str) -> None:
    assert detector.scan(text) == []


def test_a_json_value_is_scanned_in_one_call_and_findings_name_their_path(
        detector: Detector) -> None:
    messages = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": [
            {"type": "text", "text": "Pay to DE89370400440532013000 please"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,NDExMTExMTE="}},
        ]},
        {"role": "user", "content": "and mail jane@example.org"},
    ]
    found = detector.scan(messages)
    assert [(f.entity, f.path) for f in found] == [
        ("IBAN_CODE", "[1].content[0].text"), ("EMAIL_ADDRESS", "[2].content")]
    text = messages[1]["content"][0]["text"]  # type: ignore[index]
    assert text[found[0].start:found[0].end] == "DE89370400440532013000"
    masked = mask(messages, found)
    assert masked[1]["content"][0]["text"] == "Pay to <IBAN_CODE> please"
    assert masked[2]["content"] == "and mail <EMAIL_ADDRESS>"
    assert masked[0] == messages[0]
    assert "DE89" in json.dumps(messages)  # the input is not changed
    assert all("DE89" not in json.dumps(f.as_record()) for f in found)


def test_the_public_scan_function_takes_text_or_json() -> None:
    assert [f.entity for f in scan({"query": "IBAN DE89370400440532013000"})] == ["IBAN_CODE"]
    assert scan("nothing to see") == []


def test_precision_and_recall_on_the_generated_labelled_set(detector: Detector) -> None:
    tp = fp = fn = 0
    for sample, _valid in generate(n_per_entity=150):
        found = [(f.entity, f.start, f.end) for f in detector.scan(sample.text)]
        a, b, c = score(found, sample.spans)
        tp, fp, fn = tp + a, fp + b, fn + c
    precision, recall = tp / (tp + fp), tp / (tp + fn)
    assert tp + fn == 150 * 10  # every planted valid identifier is counted
    assert recall >= 0.99, (tp, fp, fn)
    assert precision >= 0.99, (tp, fp, fn)


def test_the_detector_builds_and_scans_with_sockets_forbidden() -> None:
    # A child process in which any socket use, DNS included, raises: Presidio must not fetch
    # a spaCy model, tldextract must not fetch a suffix list, phonenumbers stays offline.
    code = textwrap.dedent("""
        import sys
        def guard(event, args):
            if event.startswith("socket.") and event != "socket.__new__" or event in (
                    "socket.getaddrinfo", "socket.gethostbyname"):
                raise RuntimeError("network use: " + event)
        sys.addaudithook(guard)
        import spacy.util
        from policy.pii import Detector
        d = Detector()
        found = d.scan("mail a@example.org, call +33 1 42 68 53 00, IBAN DE89370400440532013000")
        print(sorted(f.entity for f in found))
        print(sorted(spacy.util.get_installed_models()))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "['EMAIL_ADDRESS', 'IBAN_CODE', 'PHONE_NUMBER']"
    assert lines[1] == "[]"  # no spaCy model is installed, none was needed


POLICY = """\
version: 1
data_classes: [public, internal, personal]
pii:
  default_class: personal
  recognizers:
    - entity: EMPLOYEE_ID
      patterns: [{regex: "\\\\bEMP(?P<id>\\\\d{8})\\\\b", score: 0.3}]
      context: [employee, personnel]
      validator: luhn
      validated_score: 0.4
"""


def test_operator_recognisers_from_the_policy_file_need_their_check_and_context() -> None:
    pol = Policy.from_text(POLICY)
    assert pol.pii is not None
    d = pol.pii.load()
    assert [f.entity for f in d.scan("employee EMP12345678")] == []  # EMP + 8 digits: no Luhn
    assert [f.entity for f in d.scan("employee EMP12345674")] == ["EMPLOYEE_ID"]
    assert d.scan("ticket EMP12345674") == []  # no context word: below the threshold
    assert [f.entity for f in d.scan("IBAN DE89370400440532013000")] == ["IBAN_CODE"]


@pytest.mark.parametrize(("change", "problem"), [
    ("      validator: luhn\n", "      validator: crc32\n"),
    ('{regex: "\\\\bEMP', '{regex: "(\\\\bEMP'),
    ("  default_class: personal\n", "  default_class: secret\n"),
])
def test_a_wrong_pii_section_is_refused_naming_the_line(change: str, problem: str) -> None:
    with pytest.raises(PolicyFileError) as info:
        Policy.from_text(POLICY.replace(change, problem), "p.yaml")
    assert str(info.value).startswith("p.yaml:")
    assert "pii." in str(info.value)
