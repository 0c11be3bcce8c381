"""Check-digit algorithms of the identifiers the built-in recognisers find.

Every function takes the identifier's characters with separators (spaces, dots, hyphens,
slashes) already removed and upper-cased (:func:`compact`), and returns whether its check
digit(s) are right. Sources of the algorithms:

* IBAN: ISO 13616-1, check digits by ISO 7064 MOD 97-10 (the rearranged number mod 97 is 1);
  lengths per country from the SWIFT IBAN registry.
* Payment cards: the Luhn formula (ISO/IEC 7812-1 Annex B).
* DE Steuerliche Identifikationsnummer and DE USt-IdNr: ISO 7064 MOD 11,10.
* FR NIR (numéro de sécurité sociale): key = 97 - (first 13 digits mod 97), Corsica 2A/2B
  counted as 19/18; FR TVA: key = (12 + 3 * (SIREN mod 97)) mod 97.
* IT codice fiscale: DM 23/12/1976, odd/even character tables, sum mod 26; IT partita IVA:
  Luhn over 11 digits.
* ES DNI/NIE: letter ``TRWAGMYFPDXBNJZSQVHLCKE[n mod 23]`` (NIE X/Y/Z read as 0/1/2);
  ES CIF: Orden EHA/451/2008 control digit or letter.
* NL BSN: the "elfproef" (weights 9..2 and -1, sum divisible by 11); NL btw-id: elfproef of
  the first nine digits (old numbers) or ISO 7064 MOD 97-10 over ``NL`` + number (since 2020).
* PL PESEL: weights 1,3,7,9,1,3,7,9,1,3, check = (10 - sum mod 10) mod 10;
  PL NIP: weights 6,5,7,2,3,4,5,6,7, check = sum mod 11 (10 never issued).
"""

from __future__ import annotations

import re

__all__ = [
    "IBAN_LENGTHS",
    "compact",
    "de_tax_id_valid",
    "de_vat_valid",
    "es_cif_valid",
    "es_dni_valid",
    "es_nie_valid",
    "fr_nir_valid",
    "fr_vat_valid",
    "iban_valid",
    "it_fiscal_code_valid",
    "it_vat_valid",
    "luhn_valid",
    "nl_bsn_valid",
    "nl_vat_valid",
    "pl_nip_valid",
    "pl_pesel_valid",
    "vat_valid",
]

_SEPARATORS = re.compile(r"[\s.\-/]+")

#: IBAN length per country (SWIFT IBAN registry; EU/EEA and neighbours).
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AT": 20, "BE": 16, "BG": 22, "CH": 21, "CY": 28, "CZ": 24, "DE": 22, "DK": 18,
    "EE": 20, "ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GI": 23, "GL": 18, "GR": 27,
    "HR": 21, "HU": 28, "IE": 22, "IS": 26, "IT": 27, "LI": 21, "LT": 20, "LU": 20, "LV": 21,
    "MC": 27, "MT": 31, "NL": 18, "NO": 15, "PL": 28, "PT": 25, "RO": 24, "SE": 24, "SI": 19,
    "SK": 24, "SM": 27, "VA": 22, "UA": 29, "TR": 26, "RS": 22, "ME": 22, "MK": 19, "AL": 28,
    "BA": 20, "XK": 20, "MD": 24, "GE": 22, "IL": 23, "SA": 24, "AE": 23,
}


def compact(text: str) -> str:
    """Remove separators (whitespace, ``.``, ``-``, ``/``) and upper-case."""
    return _SEPARATORS.sub("", text).upper()


def _mod97(alnum: str) -> int:
    return int("".join(str(int(c, 36)) for c in alnum)) % 97


def iban_valid(value: str) -> bool:
    """ISO 13616 IBAN: known country, its length, MOD 97-10 remainder 1."""
    if len(value) < 15 or not value.isalnum() or not value.isascii():
        return False
    expected = IBAN_LENGTHS.get(value[:2])
    if expected is None or len(value) != expected or not value[2:4].isdigit():
        return False
    return _mod97(value[4:] + value[:4]) == 1


def luhn_valid(value: str) -> bool:
    """Luhn formula over a digit string (ISO/IEC 7812-1)."""
    if not value.isdigit() or not value.isascii():
        return False
    total = 0
    for i, ch in enumerate(reversed(value)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _iso7064_mod11_10(digits: str) -> int:
    product = 10
    for ch in digits:
        s = (int(ch) + product) % 10 or 10
        product = (s * 2) % 11
    check = 11 - product
    return 0 if check == 10 else check


def de_tax_id_valid(value: str) -> bool:
    """DE Steuer-IdNr: 11 digits, no leading 0, no digit more than three times in the first
    ten, ISO 7064 MOD 11,10 check digit."""
    if len(value) != 11 or not value.isdigit() or value[0] == "0":
        return False
    if max(value[:10].count(d) for d in set(value[:10])) > 3:  # BZSt: no digit 4+ times
        return False
    return _iso7064_mod11_10(value[:10]) == int(value[10])


def de_vat_valid(value: str) -> bool:
    """DE USt-IdNr (without ``DE``): 9 digits, ISO 7064 MOD 11,10 check digit."""
    if len(value) != 9 or not value.isdigit():
        return False
    return _iso7064_mod11_10(value[:8]) == int(value[8])


def fr_nir_valid(value: str) -> bool:
    """FR NIR: 13 characters (digits, or 2A/2B for Corsica) and a two-digit key."""
    if len(value) != 15 or not value[13:].isdigit() or value[0] not in "12378":
        return False
    body = value[:13].replace("2A", "19", 1).replace("2B", "18", 1)
    if not body.isdigit():
        return False
    return 97 - int(body) % 97 == int(value[13:])


def fr_vat_valid(value: str) -> bool:
    """FR TVA (without ``FR``): two-digit key and the 9-digit SIREN."""
    if len(value) != 11 or not value.isdigit():
        return False
    return (12 + 3 * (int(value[2:]) % 97)) % 97 == int(value[:2])


_CF_ODD = dict(zip(
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    [1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4, 18, 20, 11,
     3, 6, 8, 12, 14, 16, 10, 22, 25, 24, 23],
    strict=True,
))
_CF_FORM = re.compile(r"[A-Z]{6}[0-9LMNPQRSTUV]{2}[ABCDEHLMPRST][0-9LMNPQRSTUV]{2}[A-Z]"
                      r"[0-9LMNPQRSTUV]{3}[A-Z]")


def it_fiscal_code_valid(value: str) -> bool:
    """IT codice fiscale: 16 characters in the legal form, check letter by the odd/even tables."""
    if _CF_FORM.fullmatch(value) is None:
        return False
    total = 0
    for i, ch in enumerate(value[:15]):
        total += _CF_ODD[ch] if i % 2 == 0 else (int(ch) if ch.isdigit() else ord(ch) - 65)
    return chr(65 + total % 26) == value[15]


def it_vat_valid(value: str) -> bool:
    """IT partita IVA (without ``IT``): 11 digits, Luhn check digit."""
    return len(value) == 11 and luhn_valid(value) and value[:7] != "0000000"


_DNI_LETTERS = "TRWAGMYFPDXBNJZSQVHLCKE"


def es_dni_valid(value: str) -> bool:
    """ES DNI: 8 digits and the mod-23 letter."""
    return (len(value) == 9 and value[:8].isdigit()
            and _DNI_LETTERS[int(value[:8]) % 23] == value[8])


def es_nie_valid(value: str) -> bool:
    """ES NIE: X, Y or Z, 7 digits and the mod-23 letter (X/Y/Z read as 0/1/2)."""
    if len(value) != 9 or value[0] not in "XYZ" or not value[1:8].isdigit():
        return False
    return _DNI_LETTERS[int(str("XYZ".index(value[0])) + value[1:8]) % 23] == value[8]


def es_cif_valid(value: str) -> bool:
    """ES CIF (legal entities): a letter, 7 digits, a control digit or letter."""
    if len(value) != 9 or value[0] not in "ABCDEFGHJNPQRSUVW" or not value[1:8].isdigit():
        return False
    digits = value[1:8]
    even = sum(int(d) for d in digits[1::2])
    odd = sum(sum(divmod(int(d) * 2, 10)) for d in digits[0::2])
    control = (10 - (even + odd) % 10) % 10
    return value[8] in (str(control), "JABCDEFGHI"[control])


def nl_bsn_valid(value: str) -> bool:
    """NL BSN: 9 digits passing the elfproef (weights 9..2, last -1), not all zero."""
    if len(value) != 9 or not value.isdigit() or value == "000000000":
        return False
    total = sum(int(d) * w for d, w in zip(value[:8], range(9, 1, -1), strict=True))
    return (total - int(value[8])) % 11 == 0


def nl_vat_valid(value: str) -> bool:
    """NL btw-id (without ``NL``): 9 digits, ``B``, 2 digits; elfproef or MOD 97-10."""
    if len(value) != 12 or value[9] != "B" or not (value[:9] + value[10:]).isdigit():
        return False
    if nl_bsn_valid(value[:9]):
        return True
    return _mod97("NL" + value) == 1


_PESEL_WEIGHTS = (1, 3, 7, 9, 1, 3, 7, 9, 1, 3)


def pl_pesel_valid(value: str) -> bool:
    """PL PESEL: 11 digits, a possible birth date (month + century offset), check digit."""
    if len(value) != 11 or not value.isdigit():
        return False
    month, day = int(value[2:4]) % 20, int(value[4:6])
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return False
    total = sum(int(d) * w for d, w in zip(value[:10], _PESEL_WEIGHTS, strict=True))
    return (10 - total % 10) % 10 == int(value[10])


_NIP_WEIGHTS = (6, 5, 7, 2, 3, 4, 5, 6, 7)


def pl_nip_valid(value: str) -> bool:
    """PL NIP (without ``PL``): 10 digits, weighted sum mod 11 is the last digit."""
    if len(value) != 10 or not value.isdigit():
        return False
    check = sum(int(d) * w for d, w in zip(value[:9], _NIP_WEIGHTS, strict=True)) % 11
    return check != 10 and check == int(value[9])


def _es_vat_valid(value: str) -> bool:
    return es_dni_valid(value) or es_nie_valid(value) or es_cif_valid(value)


_VAT = {
    "DE": de_vat_valid, "FR": fr_vat_valid, "IT": it_vat_valid, "ES": _es_vat_valid,
    "NL": nl_vat_valid, "PL": pl_nip_valid,
}


def vat_valid(value: str) -> bool:
    """EU VAT id with its country prefix: DE, FR, IT, ES, NL and PL, each with its check."""
    check = _VAT.get(value[:2])
    return check is not None and check(value[2:])
