"""Check-digit algorithms: published examples, and Presidio's own validators as an oracle."""

from __future__ import annotations

import random

import pytest

from bench.pii_corpus import GENERATORS, _corrupt
from policy.pii import checksums as cs

PUBLISHED = [  # examples printed by the issuing bodies or the standards' texts
    (cs.iban_valid, "DE89370400440532013000"),
    (cs.iban_valid, "GB82WEST12345698765432"),
    (cs.iban_valid, "FR1420041010050500013M02606"),
    (cs.iban_valid, "NL91ABNA0417164300"),
    (cs.luhn_valid, "4111111111111111"),
    (cs.luhn_valid, "79927398713"),
    (cs.pl_pesel_valid, "44051401359"),
    (cs.nl_bsn_valid, "111222333"),
    (cs.es_dni_valid, "12345678Z"),
    (cs.es_nie_valid, "X1234567L"),
    (cs.it_fiscal_code_valid, "RSSMRA85T10A562S"),
    (cs.fr_nir_valid, "255081416802538"),
    (cs.vat_valid, "DE136695976"),
    (cs.vat_valid, "FR40303265045"),
    (cs.vat_valid, "IT00743110157"),
    (cs.vat_valid, "PL5260001246"),
    (cs.vat_valid, "ESA28015865"),
    (cs.vat_valid, "NL004495445B01"),
]


@pytest.mark.parametrize(("check", "value"), PUBLISHED)
def test_published_examples_pass_and_one_changed_character_fails(check, value) -> None:
    assert check(value)
    rng = random.Random(value)  # noqa: S311 - reproducible, not secrets
    for _ in range(20):  # position 4 lies inside every checked body (NL's branch digits are not)
        assert not check(_corrupt(value, 4, rng))


def test_compact_removes_the_separators_people_write() -> None:
    assert cs.compact("de89 3704-0044.0532/0130 00") == "DE89370400440532013000"


def test_corsican_nir_counts_2a_and_2b() -> None:
    body = "185052A004012"  # 13 characters, department 2A
    key = 97 - int(body.replace("2A", "19")) % 97
    assert cs.fr_nir_valid(f"{body}{key:02d}")
    assert not cs.fr_nir_valid(f"{body}{(key + 1) % 100:02d}")


ORACLES = {  # Presidio's own recognisers validate the same identifiers independently
    "IBAN_CODE": "IbanRecognizer",
    "CREDIT_CARD": "CreditCardRecognizer",
    "DE_TAX_ID": "DeTaxIdRecognizer",
    "ES_NIF": "EsNifRecognizer",
    "ES_NIE": "EsNieRecognizer",
    "IT_FISCAL_CODE": "ItFiscalCodeRecognizer",
    "PL_PESEL": "PlPeselRecognizer",
}


@pytest.mark.parametrize("entity", sorted(ORACLES))
def test_generated_identifiers_agree_with_presidios_validators(entity: str) -> None:
    import presidio_analyzer.predefined_recognizers as predefined

    oracle = getattr(predefined, ORACLES[entity])()
    make = GENERATORS[entity][0]
    rng = random.Random(entity)  # noqa: S311 - reproducible, not secrets
    for _ in range(300):
        value = make(rng)
        assert oracle.validate_result(value) is True, value
        wrong = _corrupt(value, -1 if entity != "IBAN_CODE" else 2, rng)
        assert oracle.validate_result(wrong) is not True, wrong
