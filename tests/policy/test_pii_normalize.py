"""Identifiers written with Unicode look-alikes (spaces, digits, invisible characters) are found
and masked in the string as written; integral floats are scanned as their digits."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policy import PiiRefused, Policy
from policy.pii import Detector, mask
from policy.pii.normalize import view

CARD = "4111111111111111"
IBAN = "DE89370400440532013000"

#: Separators a pasted identifier carries between its groups (spaces of category Zs, the tab).
SPACES = ["\u00a0", "\u202f", "\u2009", "\u2007", "\u3000", "\u2002", "\t", " "]
#: Invisible characters anywhere inside it.
INVISIBLE = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"]
#: Zeros of decimal-digit sets (ASCII, fullwidth, Arabic-Indic, extended Arabic-Indic,
#: Devanagari, Bengali, Thai, mathematical bold).
ZEROS = [0x30, 0xFF10, 0x660, 0x6F0, 0x966, 0x9E6, 0xE50, 0x1D7CE]


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector()


@st.composite
def written(draw: st.DrawFn, ident: str, group: int) -> str:
    """``ident`` grouped by ``group`` characters with one random space, its digits in one
    random digit set, and random invisible characters inside."""
    zero = draw(st.sampled_from(ZEROS))
    sep = draw(st.sampled_from(SPACES))
    grouped = draw(st.booleans())
    out: list[str] = []
    for i, c in enumerate(ident):
        if grouped and i and i % group == 0:
            out.append(sep)
        if i and draw(st.integers(0, 5)) == 0:
            out.append(draw(st.sampled_from(INVISIBLE)))
        out.append(chr(zero + int(c)) if c.isdigit() else c)
    return "".join(out)


def _digits_left(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) == "Nd"]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(card=written(CARD, 4), iban=written(IBAN, 4), lower=st.booleans())
def test_an_identifier_in_any_spacing_and_digit_form_is_found_and_masked_as_written(
        detector: Detector, card: str, iban: str, lower: bool) -> None:
    iban = iban.lower() if lower else iban
    value = {"messages": [{"role": "user", "content": f"my card {card}, thanks"},
                          {"role": "user", "content": f"pay to {iban} today"}]}
    found = detector.scan(value)
    assert sorted(f.entity for f in found) == ["CREDIT_CARD", "IBAN_CODE"], (card, iban)
    masked = mask(value, found)
    assert masked["messages"][0]["content"] == "my card <CREDIT_CARD>, thanks"
    assert masked["messages"][1]["content"] == "pay to <IBAN_CODE> today"
    assert _digits_left(json.dumps(masked, ensure_ascii=False)) == []
    for f in found:  # offsets are in the string as written
        text = value["messages"][0 if f.entity == "CREDIT_CARD" else 1]["content"]
        assert text[f.start:f.end] == (card if f.entity == "CREDIT_CARD" else iban)


@pytest.mark.parametrize("iban", ["DE89.3704.0044.0532.0130.00", "DE89-3704-0044-0532-0130-00",
                                  "de89 3704 0044 0532 0130 00", "de89370400440532013000"])
def test_an_iban_grouped_by_dots_or_dashes_or_in_lower_case_is_found(
        detector: Detector, iban: str) -> None:
    [f] = detector.scan(f"IBAN {iban}.")
    assert (f.entity, f.start, f.end) == ("IBAN_CODE", 5, 5 + len(iban))


def test_a_card_grouped_by_dots_is_found(detector: Detector) -> None:
    [f] = detector.scan("card 4111.1111.1111.1111 exp 12/27")
    assert (f.entity, f.start, f.end) == ("CREDIT_CARD", 5, 24)


@pytest.mark.parametrize("literal", ["4111111111111111.0", "4.111111111111111e15",
                                     "-4111111111111111.0"])
def test_a_card_sent_as_a_json_float_is_found_as_a_number(
        detector: Detector, literal: str) -> None:
    [f] = detector.scan(json.loads('{"n": ' + literal + "}"))
    assert (f.entity, f.path, f.form, f.maskable) == ("CREDIT_CARD", "n", "number", False)


@pytest.mark.parametrize("value", [411111111111.5, 1e300, float("inf"), 12345.0, True])
def test_a_fraction_an_infinity_or_a_short_number_is_not_read_as_digits(
        detector: Detector, value: object) -> None:
    assert detector.scan({"n": value}) == []


def test_a_card_in_a_float_is_refused_under_mask_like_an_integer() -> None:
    policy = Policy.from_text("version: 1\ndata_classes: [public, personal]\n"
                              "pii:\n  default_action: mask\n")
    assert policy.pii is not None
    for number in (4111111111111111, 4111111111111111.0):
        with pytest.raises(PiiRefused) as info:
            policy.pii.inspect({"n": number}, "k", None, "public")
        assert info.value.verdict.refused == ("CREDIT_CARD",)


def test_the_view_of_plain_ascii_is_the_text_itself() -> None:
    text = "hello 4111 1111\nworld"
    v = view(text)
    assert v.text is text and v.starts is None


def test_the_view_maps_offsets_past_removed_characters() -> None:
    v = view("a\u200bb\u00a0\uff11")
    assert v.text == "ab 1"
    assert v.span(1, 4) == (2, 5)
