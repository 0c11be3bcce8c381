"""The recognisers: built-in EU identifiers and the operator's own, as Presidio recognisers.

Each recogniser is a :class:`presidio_analyzer.PatternRecognizer` whose ``validate_result``
runs a check-digit algorithm (:mod:`policy.pii.checksums`). Presidio keeps a match whose check
passes with the recogniser's ``validated_score`` (1.0 for identifiers whose form and check make
an accidental match rare; lower for bare digit strings whose check passes by chance one time in
ten, which then need a context word nearby to reach the threshold) and drops a match whose
check fails. Patterns are case-sensitive (identifiers are written in capitals) except the
IBAN's (often typed in lower case); context words are matched on lower-cased tokens. They run on
the normalised view of a text (:mod:`policy.pii.normalize`), so they are written for ASCII.

Presidio is imported by :func:`build_recognizers` only (about 2 s of imports: spaCy, thinc),
which the detector calls once at start-up, never per request.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import checksums as cs

if TYPE_CHECKING:
    from presidio_analyzer import PatternRecognizer

__all__ = ["BUILTIN", "VALIDATORS", "RecognizerSpec", "build_recognizers"]


def _ipv6_valid(value: str) -> bool:
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return value.count(":") >= 2


def _ipv4_valid(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True


def _ip_valid(value: str) -> bool:
    return _ipv4_valid(value) if ":" not in value else _ipv6_valid(value)


_CARD_PREFIX = re.compile(
    r"4|5[1-5]|2(?:2[2-9]|[3-6]\d|7[01]|720)|3[47]|3[0689]|6(?:011|2|4[4-9]|5)")


def _card_valid(value: str) -> bool:
    return (13 <= len(value) <= 19 and _CARD_PREFIX.match(value) is not None
            and cs.luhn_valid(value))


def _phone_valid(value: str) -> bool:
    import phonenumbers

    try:
        number = phonenumbers.parse(value, None)
    except phonenumbers.NumberParseException:
        return False
    return bool(phonenumbers.is_valid_number(number))


def _digits_9_15(value: str) -> bool:
    return 9 <= sum(c.isdigit() for c in value) <= 15


#: Validators an operator-defined recogniser may name in the policy file (input: the match
#: with separators removed and upper-cased, except ``phone`` and ``ip`` which take it as is).
VALIDATORS: dict[str, Callable[[str], bool]] = {
    "iban": cs.iban_valid,
    "luhn": cs.luhn_valid,
    "card": _card_valid,
    "de_tax_id": cs.de_tax_id_valid,
    "fr_nir": cs.fr_nir_valid,
    "it_fiscal_code": cs.it_fiscal_code_valid,
    "es_dni": cs.es_dni_valid,
    "es_nie": cs.es_nie_valid,
    "es_cif": cs.es_cif_valid,
    "nl_bsn": cs.nl_bsn_valid,
    "pl_pesel": cs.pl_pesel_valid,
    "pl_nip": cs.pl_nip_valid,
    "vat": cs.vat_valid,
    "ipv4": _ipv4_valid,
    "ipv6": _ipv6_valid,
    "ip": _ip_valid,
    "phone": _phone_valid,
}

_RAW_INPUT = frozenset({"ip", "ipv4", "ipv6", "phone"})


@dataclass(frozen=True, slots=True)
class RecognizerSpec:
    """One recogniser, before it is built into a Presidio recogniser.

    Attributes:
        entity: entity type reported (``IBAN_CODE``, ``DE_TAX_ID``, ...).
        patterns: ``(regex, score)`` pairs; the score applies when no validator decides.
        context: words that raise a match's score when they occur shortly before it.
        validator: name in :data:`VALIDATORS`, or ``None`` (the pattern score stands).
        validated_score: score of a match whose check passes (0..1).
        ignore_case: match the patterns case-insensitively.
    """

    entity: str
    patterns: tuple[tuple[str, float], ...]
    context: tuple[str, ...] = ()
    validator: str | None = None
    validated_score: float = 1.0
    ignore_case: bool = False
    name: str = field(default="")


_SEP = r"[ ]?"
BUILTIN: tuple[RecognizerSpec, ...] = (
    RecognizerSpec(
        "IBAN_CODE",
        # Grouped by spaces (or not), or by a dot or dash before every group; any case (the
        # check reads it upper-cased).
        ((r"\b[A-Z]{2}\d{2}(?:(?:[ ]?[A-Z0-9]{4}){2,7}(?:[ ]?[A-Z0-9]{1,3})?"
          r"|(?:[.-][A-Z0-9]{4}){2,7}(?:[.-][A-Z0-9]{1,3})?)\b", 0.1),),
        ("iban", "konto", "account", "compte", "conto", "cuenta", "rekening", "rachunek"),
        "iban",
        ignore_case=True,
    ),
    RecognizerSpec(
        "CREDIT_CARD",
        # Not a run of groups inside a longer number or after an IBAN's country and check.
        ((r"(?<![A-Z]{2}\d{2}[ .-])(?<!\d{4}[ .-])\b\d{4}([ .-]?)\d{4}\1\d{4}\1\d{4}"
          r"(?:\1\d{3})?\b(?![ .-]\d)", 0.1),
         (r"(?<![A-Z]{2}\d{2}[ .-])(?<!\d{4}[ .-])\b3[47]\d{2}([ .-]?)\d{6}\1\d{5}\b"
          r"(?![ .-]\d)", 0.1),
         (r"\b\d{13,19}\b", 0.1)),
        ("card", "credit", "visa", "mastercard", "karte", "carte", "carta", "tarjeta", "karta"),
        "card",
    ),
    RecognizerSpec(
        "EMAIL_ADDRESS",
        ((r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
          r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.[A-Za-z]{2,24}\b", 0.9),),
        ("email", "e-mail", "mail"),
    ),
    RecognizerSpec(
        "PHONE_NUMBER",
        ((r"(?<![\w+])(?:\+|00)[1-9]\d{0,2}[ .\-/]?(?:\(0\)[ ]?)?\(?\d{1,4}\)?"
          r"(?:[ .\-/]?\d{2,4}){1,4}\b", 0.1),),
        ("phone", "tel", "telefon", "telephone", "téléphone", "telefono", "teléfono", "mobile",
         "handy", "cell"),
        "phone",
        validated_score=0.85,
    ),
    RecognizerSpec(
        "IP_ADDRESS",
        ((r"\b(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\b",
          0.1),
         (r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])", 0.1)),
        ("ip", "address", "host", "adresse", "indirizzo", "dirección", "adres"),
        "ip",
        validated_score=0.8,
    ),
    RecognizerSpec(
        "DE_TAX_ID",
        ((r"\b[1-9]\d(?: ?\d{3}){3}\b", 0.1),),
        ("steuer", "steuerid", "steuer-id", "idnr", "steuer-idnr", "identifikationsnummer",
         "steueridentifikationsnummer", "tin"),
        "de_tax_id",
        validated_score=0.4,
    ),
    RecognizerSpec(
        "FR_NIR",
        ((r"\b[12378] ?\d{2} ?(?:0[1-9]|1[0-2]|[2-9]\d) ?(?:\d{2}|2[AB]) ?\d{3} ?\d{3} ?\d{2}\b",
          0.1),),
        ("nir", "sécurité", "securite", "insee", "sociale", "vitale"),
        "fr_nir",
    ),
    RecognizerSpec(
        "IT_FISCAL_CODE",
        ((r"\b[A-Z]{6}[0-9LMNPQRSTUV]{2}[ABCDEHLMPRST][0-9LMNPQRSTUV]{2}[A-Z]"
          r"[0-9LMNPQRSTUV]{3}[A-Z]\b", 0.1),),
        ("codice", "fiscale", "cf"),
        "it_fiscal_code",
    ),
    RecognizerSpec(
        "ES_NIF",
        ((r"\b\d{8}[ -]?[A-Z]\b", 0.1),),
        ("dni", "nif", "documento"),
        "es_dni",
        validated_score=0.6,
    ),
    RecognizerSpec(
        "ES_NIE",
        ((r"\b[XYZ][ -]?\d{7}[ -]?[A-Z]\b", 0.1),),
        ("nie", "extranjero"),
        "es_nie",
        validated_score=0.9,
    ),
    RecognizerSpec(
        "NL_BSN",
        ((r"\b(?:\d{9}|\d{3}[ .]\d{3}[ .]\d{3}|\d{4}[ .]\d{2}[ .]\d{3})\b", 0.1),),
        ("bsn", "burgerservicenummer", "sofinummer", "sofi"),
        "nl_bsn",
        validated_score=0.4,
    ),
    RecognizerSpec(
        "PL_PESEL",
        ((r"\b\d{11}\b", 0.1),),
        ("pesel",),
        "pl_pesel",
        validated_score=0.4,
    ),
    RecognizerSpec(
        "EU_VAT_ID",
        ((r"\b(?:DE ?\d{9}|FR ?\d{2} ?\d{3} ?\d{3} ?\d{3}|IT ?\d{11}|ES ?[A-Z0-9]\d{7}[A-Z0-9]"
          r"|NL ?\d{9}B\d{2}|PL ?\d{3}[ -]?\d{3}[ -]?\d{2}[ -]?\d{2})\b", 0.1),),
        ("vat", "ust-idnr", "ust", "tva", "iva", "btw", "nip"),
        "vat",
    ),
)


def build_recognizers(specs: Sequence[RecognizerSpec],
                      checkpoint: Callable[[], None] | None = None) -> list[PatternRecognizer]:
    """Build Presidio recognisers from specs (imports Presidio).

    Args:
        specs: the recognisers.
        checkpoint: called before each recogniser runs and on each of its matches; it raises
            to stop the scan (:class:`policy.pii.engine.ScanStopped`).

    Raises:
        KeyError: a spec names an unknown validator (the policy model checks this first).
    """
    from presidio_analyzer import Pattern, PatternRecognizer  # slow import: only here

    class _Checked(PatternRecognizer):
        def __init__(self, spec: RecognizerSpec) -> None:
            flags = re.DOTALL | re.MULTILINE | (re.IGNORECASE if spec.ignore_case else 0)
            super().__init__(
                supported_entity=spec.entity,
                name=spec.name or f"sg_{spec.entity.lower()}",
                patterns=[Pattern(f"{spec.entity}_{i}", rx, score)
                          for i, (rx, score) in enumerate(spec.patterns)],
                context=list(spec.context),
                global_regex_flags=flags,
            )
            self._check = VALIDATORS[spec.validator] if spec.validator else None
            # A pattern with a group named ``id`` hands only that group to the validator
            # (``EMP(?P<id>\d{8})``: the Luhn check runs on the digits).
            self._groups = [re.compile(rx, flags) for rx, _ in spec.patterns if "(?P<id>" in rx]
            self._raw = spec.validator in _RAW_INPUT
            self._validated_score = spec.validated_score

        def validate_result(self, pattern_text: str) -> bool | None:
            if checkpoint is not None:  # Presidio calls this on every match
                checkpoint()
            if self._check is None:
                return None
            for rx in self._groups:
                m = rx.search(pattern_text)
                if m is not None and m.group("id") is not None:
                    pattern_text = m.group("id")
                    break
            value = pattern_text.strip() if self._raw else cs.compact(pattern_text)
            if not self._check(value):
                return False
            if self._validated_score >= 1.0:
                return True
            return None  # keep the score set in analyze (below the threshold without context)

        def analyze(self, text: str, entities: list[str], nlp_artifacts: Any = None,
                    regex_flags: int | None = None) -> list[Any]:
            if checkpoint is not None:
                checkpoint()
            results: list[Any] = super().analyze(text, entities, nlp_artifacts, regex_flags)
            if self._check is not None and self._validated_score < 1.0:
                for r in results:
                    r.score = self._validated_score
            return results

    return [_Checked(spec) for spec in specs]
