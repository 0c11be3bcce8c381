"""Context words read from a window around each match (policy.pii.context) decide exactly as
Presidio's own enhancer over the whole text's words: same findings, spans and scores."""

from __future__ import annotations

import random

import pytest

from bench.pii import _prompt
from bench.pii_corpus import generate
from policy.pii import Detector, Finding
from policy.pii.context import WINDOW


@pytest.fixture(scope="module")
def pair() -> tuple[Detector, Detector]:
    """(windowed, Presidio's enhancer over the whole text)."""
    return Detector(), Detector(windowed_context=False)


def _same(pair: tuple[Detector, Detector], value: object) -> list[Finding]:
    windowed, whole = pair
    got, want = windowed.scan(value), whole.scan(value)
    assert got == want, value
    return got


def test_labelled_set_and_bench_prompts_give_the_same_findings(
        pair: tuple[Detector, Detector]) -> None:
    found = 0
    for sample, _ in generate(n_per_entity=100):
        found += len(_same(pair, sample.text))
    for kb in (1, 4, 16):
        for ids in (False, True):
            found += len(_same(pair, _prompt(kb, ids)))
    assert found > 1000


def test_context_far_from_the_match_behind_stop_words_and_punctuation(
        pair: tuple[Detector, Detector]) -> None:
    """Context words separated from the match by runs of stop words and punctuation longer than
    the first window (so it must widen), before and after the match, at the text's ends, and
    in JSON values of several strings."""
    rng = random.Random(34)  # noqa: S311 - reproducible, not secrets
    fillers = ["the", "of", "and", ",", ".", "-", "it", "is", "(", "was", "report", "x"]
    samples = [s.text for s, valid in generate(n_per_entity=10, seed=5) if valid]
    by_context = {True: 0, False: 0}
    for text in samples:
        for run in (0, 3, 40, WINDOW, 3 * WINDOW):
            filler = " ".join(rng.choice(fillers[:10]) for _ in range(run))
            stop_only = " ".join(rng.choice(fillers[:9]) for _ in range(run))
            for value in (f"BSN PESEL Steuer-ID {stop_only} {text}",
                          f"{text} {filler} BSN",
                          f"{filler}{text}{filler}",
                          {"a": f"PESEL {stop_only}", "b": [text, f"{filler} {text}"]}):
                findings = _same(pair, value)
                for f in findings:
                    if f.entity in ("NL_BSN", "PL_PESEL", "DE_TAX_ID"):
                        by_context[run >= WINDOW // 4] += 1
    # identifiers that need a context word were found both near and far from it
    assert by_context[True] > 0 and by_context[False] > 0, by_context
