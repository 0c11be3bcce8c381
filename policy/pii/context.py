"""Context words around a match, read from a window of the text instead of the whole text.

Presidio's :class:`~presidio_analyzer.context_aware_enhancers.LemmaContextAwareEnhancer` raises
a match's score when one of its recogniser's context words is a substring of one of the
keywords near it: the token holding the match's first character, the keywords before it (up to
``context_prefix_count`` of them, the token itself counting as one more) and after it (up to
``context_suffix_count``, plus one). It reads them from NLP artifacts made over the whole text,
which costs a tokenisation of the whole prompt (about a third of a 4 KB scan with identifiers).

The enhancer of :func:`make_enhancer` (``WindowedContextEnhancer``) makes the same decision
from the words of a window around each match: the window starts and ends at token boundaries
(never inside a ``\\w+`` run), so its tokens are exactly the whole text's tokens in that range,
and it is widened (doubled, up to the whole text) whenever the walk for keywords reaches a
window edge before it has collected enough.
Words, lemmas and keywords are those of the detector's offline NLP engine
(:mod:`policy.pii.engine`: ``\\w+|[^\\w\\s]``, lower-cased, spaCy's English stop words).
``tests/policy/test_pii_context.py`` checks that findings and scores equal Presidio's own
enhancer's on the labelled set and on texts whose context lies far from the match.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["WORD", "is_keyword", "make_enhancer"]

#: A word of the offline NLP engine: a run of word characters, or one other non-space character.
WORD = re.compile(r"\w+|[^\w\s]")
_WORD_CHAR = re.compile(r"\w")

#: Characters each side of a match tokenised first (the window doubles when that is too few).
WINDOW = 128


def is_keyword(lemma: str, stop_words: Any) -> bool:
    """Whether a (lower-cased) word counts as a keyword for context: not a stop word, not a
    single punctuation character (the filter of Presidio's ``NlpArtifacts.set_keywords``)."""
    return not (lemma in stop_words or (len(lemma) == 1 and not lemma.isalnum())
                or lemma == "-PRON-" or lemma == "be")


def make_enhancer(checkpoint: Callable[[], None] | None = None, **kwargs: Any) -> Any:
    """A ``WindowedContextEnhancer`` (imports Presidio and spaCy's stop words).

    Args:
        checkpoint: called before each result is enhanced; it raises to stop the scan
            (:class:`policy.pii.engine.ScanStopped`).
        **kwargs: ``context_similarity_factor`` (0.35), ``min_score_with_context_similarity``
            (0.4), ``context_prefix_count`` (5), ``context_suffix_count`` (0): Presidio's
            defaults, which the detector uses.
    """
    from presidio_analyzer import RecognizerResult
    from presidio_analyzer.context_aware_enhancers import ContextAwareEnhancer
    from spacy.lang.en.stop_words import STOP_WORDS

    id_key = RecognizerResult.RECOGNIZER_IDENTIFIER_KEY
    enhanced_key = RecognizerResult.IS_SCORE_ENHANCED_BY_CONTEXT_KEY
    keyword_cache: dict[str, bool] = {}

    def keyword(lemma: str) -> bool:
        known = keyword_cache.get(lemma)
        if known is None:
            known = is_keyword(lemma, STOP_WORDS)
            if len(keyword_cache) < 100_000:
                keyword_cache[lemma] = known
        return known

    class Enhancer(ContextAwareEnhancer):
        """Presidio's lemma context enhancement over a window of the text (module docstring)."""

        def __init__(self, context_similarity_factor: float = 0.35,
                     min_score_with_context_similarity: float = 0.4,
                     context_prefix_count: int = 5, context_suffix_count: int = 0) -> None:
            super().__init__(context_similarity_factor, min_score_with_context_similarity,
                             context_prefix_count, context_suffix_count)

        def enhance_using_context(self, text: str, raw_results: list[Any],
                                  nlp_artifacts: Any, recognizers: list[Any],
                                  context: list[str] | None = None) -> list[Any]:
            by_id = {r.id: r for r in recognizers}
            extra = [w.lower() for w in context or ()]
            for result in raw_results:
                if checkpoint is not None:
                    checkpoint()
                meta = result.recognition_metadata
                recognizer = by_id.get(meta[id_key]) if meta and id_key in meta else None
                if recognizer is None or not recognizer.context or meta.get(enhanced_key):
                    continue
                words = [*self.surrounding_words(text, result.start), *extra]
                found = next((c for c in recognizer.context
                              if any(c.lower() in w.lower() for w in words)), "")
                if found:
                    score = max(result.score + self.context_similarity_factor,
                                self.min_score_with_context_similarity)
                    result.score = min(score, ContextAwareEnhancer.MAX_SCORE)
                    result.analysis_explanation.set_supportive_context_word(found)
                    result.analysis_explanation.set_improved_score(result.score)
            return raw_results

        def surrounding_words(self, text: str, start: int) -> list[str]:
            """The keywords around the token holding ``text[start]`` (see the module
            docstring); ``[""]`` when the text has no word at all.

            Raises:
                ValueError: no token ends after ``start`` (Presidio raises the same).
            """
            back_n, fwd_n = self.context_prefix_count + 1, self.context_suffix_count + 1
            before = after = WINDOW
            while True:
                lo, hi = _boundary_before(text, start - before), _boundary_after(
                    text, start + after)
                spans = [(m.start(), m.end()) for m in WORD.finditer(text, lo, hi)]
                index = next((i for i, (s, e) in enumerate(spans) if s == start or start < e),
                             None)
                if index is None:
                    if hi < len(text):
                        after *= 2
                        continue
                    if lo == 0 and not spans:
                        return [""]
                    if lo > 0:
                        before *= 2
                        continue
                    raise ValueError("no token at the match's offset")
                lemmas = [text[s:e].lower() for s, e in spans]
                backward, whole = _collect(lemmas, index, -1, back_n, keyword)
                if not whole and lo > 0:
                    before *= 2
                    continue
                forward, whole = _collect(lemmas, index, 1, fwd_n, keyword)
                if not whole and hi < len(text):
                    after *= 2
                    continue
                return list({*backward, *forward})

    Enhancer.__name__ = Enhancer.__qualname__ = "WindowedContextEnhancer"
    return Enhancer(**kwargs)


def _boundary_before(text: str, pos: int) -> int:
    """``pos`` (clamped to the text) moved back until it does not split a ``\\w+`` run."""
    pos = max(0, pos)
    while pos > 0 and _WORD_CHAR.match(text, pos - 1):
        pos -= 1
    return pos


def _boundary_after(text: str, pos: int) -> int:
    """``pos`` (clamped to the text) moved on until it does not split a ``\\w+`` run."""
    pos = min(len(text), pos)
    while pos < len(text) and _WORD_CHAR.match(text, pos):
        pos += 1
    return pos


def _collect(lemmas: list[str], index: int, step: int, wanted: int,
             keyword: Any) -> tuple[list[str], bool]:
    """Up to ``wanted`` keywords from ``lemmas[index]`` on in direction ``step``, and whether
    that many were found before the window's edge (else the caller widens the window)."""
    out: list[str] = []
    i = index
    while 0 <= i < len(lemmas) and len(out) < wanted:
        if keyword(lemmas[i]):
            out.append(lemmas[i])
        i += step
    return out, len(out) >= wanted
