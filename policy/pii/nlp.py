"""Presidio's NLP engine without a model: the context words around a match, nothing else.

Presidio's default NLP engine loads a spaCy model (``en_core_web_lg``) and downloads it when
missing; the gateway never reaches the network on its own and needs no named entities. The
engine made here (:func:`make_nlp_engine`) serves only what the context enhancer reads: words
by a regular expression (:data:`policy.pii.context.WORD`), lower-cased as lemmas, and spaCy's
English stop-word list (shipped in the spaCy wheel). The words of a text are made on first use,
so a text in which no recogniser matched is never tokenized. :class:`policy.pii.engine.Detector`
builds it once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .context import WORD

__all__ = ["make_nlp_engine"]


class _Keywords(list[str]):
    """The keywords of a text, as :meth:`NlpArtifacts.set_keywords` lists them, with a set
    for ``in`` (Presidio's context enhancer tests each surrounding word's membership)."""

    def __init__(self, words: list[str]) -> None:
        super().__init__(words)
        self._set = frozenset(words)

    def __contains__(self, word: object) -> bool:
        return word in self._set


def make_nlp_engine(language: str) -> Any:
    """An unloaded Presidio ``NlpEngine`` for ``language`` that needs no model: words by
    :data:`policy.pii.context.WORD`, made lazily on first use (see the module docstring).
    Imports Presidio and spaCy's stop-word list (no spaCy model)."""
    from presidio_analyzer.nlp_engine import NlpArtifacts, NlpEngine
    from spacy.lang.en.stop_words import STOP_WORDS

    class LazyArtifacts(NlpArtifacts):
        """Words made on first use: the context enhancer reads them only when a recogniser
        matched, so text without candidates is never tokenized."""

        def __init__(self, engine: Any, text: str, language: str) -> None:
            # NlpArtifacts.__init__ would tokenize at once; its attributes are properties here.
            self._engine, self._text, self._language = engine, text, language
            self._words: list[str] | None = None
            self.entities: list[Any] = []
            self.nlp_engine = engine
            self.scores: list[float] = []

        def _tokens(self) -> list[str]:
            if self._words is None:
                matches = list(WORD.finditer(self._text))
                self._words = [m.group() for m in matches]
                self._indices = [m.start() for m in matches]
                self._lemmas = lemmas = [w.lower() for w in self._words]
                # NlpArtifacts.set_keywords, decided once per distinct word (a 4 KB prompt has
                # ~700 words, ~100 distinct), and a list whose ``in`` is a set lookup: the
                # context enhancer only tests membership, once per word it walks past.
                keep = {w: not (w in STOP_WORDS or (len(w) == 1 and not w.isalnum())
                                or w == "-PRON-" or w == "be")
                        for w in set(lemmas)}
                self._keywords = _Keywords([w for w in lemmas if keep[w]])
            return self._words

        @property
        def tokens(self) -> Any:  # type: ignore[override]  # lazy
            return self._tokens()

        @property
        def tokens_indices(self) -> list[int]:  # type: ignore[override]  # lazy
            self._tokens()
            return self._indices

        @property
        def lemmas(self) -> list[str]:  # type: ignore[override]  # lazy
            self._tokens()
            return self._lemmas

        @property
        def keywords(self) -> list[str]:  # type: ignore[override]  # lazy
            self._tokens()
            return self._keywords

    class OfflineNlpEngine(NlpEngine):
        """Words by a regular expression, lower-cased as lemmas, spaCy's English stop words:
        what the context enhancer needs, with no model."""

        def __init__(self) -> None:
            self._loaded = False

        def load(self) -> None:
            self._loaded = True

        def is_loaded(self) -> bool:
            return self._loaded

        def process_text(self, text: str, language: str) -> Any:
            return LazyArtifacts(self, text, language)

        def process_batch(self, texts: Any, language: str, batch_size: int = 1,
                          n_process: int = 1, **kwargs: Any) -> Iterator[Any]:
            for text in texts:
                yield text, self.process_text(text, language)

        def is_stopword(self, word: str, language: str) -> bool:
            return word in STOP_WORDS

        def is_punct(self, word: str, language: str) -> bool:
            return len(word) == 1 and not word.isalnum()

        def get_supported_entities(self) -> list[str]:
            return []

        def get_supported_languages(self) -> list[str]:
            return [language]

    return OfflineNlpEngine()
