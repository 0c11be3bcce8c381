"""A labelled corpus of EU identifiers for measuring the PII detector (tests and bench/pii.py).

Each sample is a sentence with zero or more planted identifiers and their expected entity type
and span. Identifiers are generated with right check digits (positives) and with one check
digit changed (negatives that must not be reported), written compact or split by spaces,
hyphens or dots as people write them, next to decoys (order numbers, dates, prices, versions,
times). Bare-digit identifiers whose check passes by chance one time in ten (DE tax id, NL BSN,
PL PESEL) are planted with a context word, as the recognisers require.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from policy.pii import checksums as cs

__all__ = ["GENERATORS", "Sample", "generate", "score"]


@dataclass(frozen=True, slots=True)
class Sample:
    """A text and the ``(entity, start, end)`` spans a perfect detector reports."""

    text: str
    spans: tuple[tuple[str, int, int], ...]


def _digits(rng: random.Random, n: int, first: str = "0123456789") -> str:
    return rng.choice(first) + "".join(rng.choice(string.digits) for _ in range(n - 1))


def _retry(make: Callable[[random.Random], str], valid: Callable[[str], bool],
           rng: random.Random) -> str:
    while True:
        v = make(rng)
        if valid(cs.compact(v)):
            return v


def _group(value: str, sizes: tuple[int, ...], sep: str) -> str:
    out, i = [], 0
    for s in sizes:
        out.append(value[i:i + s])
        i += s
    if i < len(value):
        out.append(value[i:])
    return sep.join(p for p in out if p)


def _iban(rng: random.Random) -> str:
    country = rng.choice(["DE", "FR", "IT", "ES", "NL", "PL", "AT", "BE"])
    n = cs.IBAN_LENGTHS[country] - 4
    if country in ("NL",):
        bban = "".join(rng.choice(string.ascii_uppercase) for _ in range(4)) + _digits(rng, n - 4)
    elif country in ("IT",):
        bban = rng.choice(string.ascii_uppercase) + _digits(rng, n - 1)
    else:
        bban = _digits(rng, n)
    check = 98 - int("".join(str(int(c, 36)) for c in bban + country + "00")) % 97
    return f"{country}{check:02d}{bban}"


def _luhn_complete(body: str) -> str:
    for d in string.digits:
        if cs.luhn_valid(body + d):
            return body + d
    raise AssertionError


def _card(rng: random.Random) -> str:
    kind = rng.choice(["visa", "mc", "amex"])
    if kind == "amex":
        return _luhn_complete(rng.choice(["34", "37"]) + _digits(rng, 12))
    prefix = "4" if kind == "visa" else rng.choice(["51", "52", "53", "54", "55"])
    return _luhn_complete(prefix + _digits(rng, 15 - len(prefix)))


def _de_tax(rng: random.Random) -> str:
    return _retry(lambda r: _digits(r, 11, "123456789"), cs.de_tax_id_valid, rng)


def _fr_nir(rng: random.Random) -> str:
    body = (rng.choice("12") + _digits(rng, 2) + f"{rng.randint(1, 12):02d}"
            + rng.choice([f"{rng.randint(1, 95):02d}", "2A", "2B"]) + _digits(rng, 6))
    num = int(body.replace("2A", "19").replace("2B", "18"))
    return f"{body}{97 - num % 97:02d}"


def _it_cf(rng: random.Random) -> str:
    letters = string.ascii_uppercase
    body = ("".join(rng.choice(letters) for _ in range(6)) + _digits(rng, 2)
            + rng.choice("ABCDEHLMPRST") + f"{rng.randint(1, 71):02d}"
            + rng.choice(letters) + _digits(rng, 3))
    for c in letters:
        if cs.it_fiscal_code_valid(body + c):
            return body + c
    raise AssertionError


def _es_dni(rng: random.Random) -> str:
    n = _digits(rng, 8)
    return n + "TRWAGMYFPDXBNJZSQVHLCKE"[int(n) % 23]


def _es_nie(rng: random.Random) -> str:
    p = rng.choice("XYZ")
    n = _digits(rng, 7)
    return p + n + "TRWAGMYFPDXBNJZSQVHLCKE"[int(str("XYZ".index(p)) + n) % 23]


def _nl_bsn(rng: random.Random) -> str:
    return _retry(lambda r: _digits(r, 9, "123456789"), cs.nl_bsn_valid, rng)


def _pl_pesel(rng: random.Random) -> str:
    def make(r: random.Random) -> str:
        return (_digits(r, 2) + f"{r.choice([0, 20]) + r.randint(1, 12):02d}"
                + f"{r.randint(1, 28):02d}" + _digits(r, 5))
    return _retry(make, cs.pl_pesel_valid, rng)


def _vat(rng: random.Random) -> str:
    country = rng.choice(["DE", "FR", "IT", "ES", "NL", "PL"])
    if country == "DE":
        return "DE" + _retry(lambda r: _digits(r, 9, "123456789"), cs.de_vat_valid, rng)
    if country == "FR":
        siren = _digits(rng, 9)
        return f"FR{(12 + 3 * (int(siren) % 97)) % 97:02d}{siren}"
    if country == "IT":
        return "IT" + _luhn_complete(_digits(rng, 10, "0123"))
    if country == "ES":
        return "ES" + rng.choice([_es_dni, _es_nie])(rng)
    if country == "NL":
        return "NL" + _nl_bsn(rng) + "B" + f"{rng.randint(1, 99):02d}"
    return "PL" + _retry(lambda r: _digits(r, 10, "123456789"), cs.pl_nip_valid, rng)


def _spaced(value: str, rng: random.Random, sizes: tuple[int, ...]) -> str:
    return rng.choice([value, _group(value, sizes, " ")])


#: entity -> (make a valid compact value, write it as people do, context word or None,
#: position of a check character to corrupt for an invalid twin)
GENERATORS: dict[str, tuple[Callable[[random.Random], str],
                            Callable[[str, random.Random], str], str | None, int]] = {
    "IBAN_CODE": (_iban, lambda v, r: _spaced(v, r, (4,) * 8), None, 2),
    "CREDIT_CARD": (_card, lambda v, r: r.choice(
        [v, _group(v, (4, 6, 5) if len(v) == 15 else (4, 4, 4, 4), r.choice(" -"))]),
        None, -1),
    "DE_TAX_ID": (_de_tax, lambda v, r: _spaced(v, r, (2, 3, 3, 3)), "Steuer-ID", -1),
    "FR_NIR": (_fr_nir, lambda v, r: _spaced(v, r, (1, 2, 2, 2, 3, 3)), None, -1),
    "IT_FISCAL_CODE": (_it_cf, lambda v, r: v, None, -1),
    "ES_NIF": (_es_dni, lambda v, r: r.choice([v, v[:8] + "-" + v[8]]), None, -1),
    "ES_NIE": (_es_nie, lambda v, r: r.choice([v, f"{v[0]}-{v[1:8]}-{v[8]}"]), None, -1),
    "NL_BSN": (_nl_bsn, lambda v, r: r.choice([v, _group(v, (4, 2, 3), "."),
                                               _group(v, (3, 3, 3), " ")]), "BSN", -1),
    "PL_PESEL": (_pl_pesel, lambda v, r: v, "PESEL", -1),
    "EU_VAT_ID": (_vat, lambda v, r: v, None, -1),
}

_TEMPLATES = (
    "Please update the record: {ctx}{id}.",
    "{ctx}{id} (see attachment) and order 8812 from 2024-03-15.",
    "Hi team,\nthe customer wrote {ctx}{id}; invoice total EUR 1.249,90, ref 20240315.",
    "Row 17: {ctx}{id}, version 3.11.7, called at 14:05:33.",
)
_DECOYS = (
    "Order 123456789012 shipped on 2024-11-02 at 09:41:10.",
    "Release 10.4.22 fixes issue 4711; build 20241102134501 passed.",
    "Tracking number 1Z999AA10123456784, phone extension 4410.",
    "Invoice INV-2024-000187 totals 12 345,67 EUR; SKU 400638133393.",
    "Coordinates 48.137154, 11.576124; ISBN 978-3-16-148410-0.",
)


def _corrupt(value: str, pos: int, rng: random.Random) -> str:
    i = pos % len(value)
    ch = value[i]
    pool = string.digits if ch.isdigit() else string.ascii_uppercase
    return value[:i] + rng.choice([c for c in pool if c != ch]) + value[i + 1:]


def generate(n_per_entity: int = 100, seed: int = 34) -> Iterator[tuple[Sample, bool]]:
    """Yield ``(sample, planted_valid)``: for each entity ``n_per_entity`` valid identifiers,
    as many invalid twins (expected spans empty), then the decoy sentences."""
    rng = random.Random(seed)  # noqa: S311 - reproducible, not secrets
    for entity, (make, write, ctx, check_pos) in GENERATORS.items():
        for _ in range(n_per_entity):
            value = make(rng)
            for valid in (True, False):
                v = value
                if not valid:
                    pos = check_pos
                    while True:  # the check position first, then any other one
                        v = _corrupt(value, pos, rng)
                        if not _VALID[entity](v):
                            break
                        pos = rng.randrange(2, len(value))
                written = write(v, rng)
                template = rng.choice(_TEMPLATES)
                prefix = f"{ctx} " if ctx else rng.choice(["", "ID "])
                text = template.format(ctx=prefix, id=written)
                start = text.index(written)
                spans = ((entity, start, start + len(written)),) if valid else ()
                yield Sample(text, spans), valid
    for text in _DECOYS:
        yield Sample(text, ()), False


_VALID: dict[str, Callable[[str], bool]] = {
    "IBAN_CODE": cs.iban_valid, "CREDIT_CARD": cs.luhn_valid, "DE_TAX_ID": cs.de_tax_id_valid,
    "FR_NIR": cs.fr_nir_valid, "IT_FISCAL_CODE": cs.it_fiscal_code_valid,
    "ES_NIF": cs.es_dni_valid, "ES_NIE": cs.es_nie_valid, "NL_BSN": cs.nl_bsn_valid,
    "PL_PESEL": cs.pl_pesel_valid, "EU_VAT_ID": cs.vat_valid,
}


def score(found: list[tuple[str, int, int]], expected: tuple[tuple[str, int, int], ...]
          ) -> tuple[int, int, int]:
    """``(true positives, false positives, false negatives)`` of one sample: a finding counts
    when its entity and exact span are expected."""
    exp = set(expected)
    got = set(found)
    return len(got & exp), len(got - exp), len(exp - got)
