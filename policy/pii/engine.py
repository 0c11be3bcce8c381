"""The detector: Presidio's analyzer with an NLP pipeline that needs no model download.

Presidio's default NLP engine loads a spaCy model (``en_core_web_lg``) and downloads it when
missing. The gateway must never reach the network on its own, and named-entity models add
hundreds of megabytes for entities (names, places) no check digit can confirm. The detector
therefore runs Presidio's :class:`~presidio_analyzer.AnalyzerEngine` with an offline NLP engine
(:mod:`policy.pii.nlp`) that only serves the context words around a match: words by a regular
expression, lower-cased, and spaCy's English stop-word list (shipped in the spaCy wheel; no
model, no download). The words are made only around a pattern match (spaCy's own tokenizer
cost ~10 ms per 4 KB here, the expression ~0.3 ms; :mod:`policy.pii.context` reads them from a
window around each match, not from the whole text).

A JSON value (a chat ``messages`` array, a Responses ``input``, MCP tool arguments) is scanned
as one text: its strings, object keys included, joined by blank lines (no recogniser pattern
crosses a line break), so one Presidio call serves a whole request; each finding is mapped back
to the JSON path of the string it is in.

Paths (:attr:`Finding.path`) go into records that promise never to hold the matched text, so a
path never carries arbitrary key text. An object's member is written by its key only when the
key is a plain identifier (``^[A-Za-z_][A-Za-z0-9_]{0,63}$``) and the key itself holds no
finding; any other member is written by its position in the object (0-based, in the object's
order), and an object key itself (a scanned string of its own) is marked as a key:

* ``messages[0].content``: member ``content`` of item 0 of ``messages``;
* ``arguments.{#2}``: the value of the third member of ``arguments`` (its key not written);
* ``arguments.{key#2}``: the third member's key itself (a finding in the key's text).

What is scanned: every string value and object key, each through its normalised view
(:mod:`policy.pii.normalize`: Unicode spaces and digits made ASCII, zero-width characters
removed; offsets map back to the string as written); every integer of six digits or more, and
every float whose value is such an integer, as its decimal text (form ``number``); the text
a ``data:`` URL or a bare base64 string carries (:mod:`policy.pii.dataurl`: decoded, form
``encoded``; binary payloads are not scanned). A finding in a key, a number or an encoded
payload cannot be masked where it is (:attr:`Finding.maskable`). Findings are
:mod:`policy.pii.findings`; masking is :mod:`policy.pii.masking`.
"""

from __future__ import annotations

import bisect
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .context import make_enhancer
from .dataurl import base64_text, data_url_text
from .findings import Finding, Form
from .masking import Label, mask
from .nlp import make_nlp_engine
from .normalize import number_text, view
from .recognizers import BUILTIN, RecognizerSpec, build_recognizers

__all__ = ["Detector", "Finding", "Form", "Label", "ScanStopped", "Texts", "iter_strings", "mask",
           "texts"]

_log = logging.getLogger(__name__)

_JOIN = "\n\n"
#: A key written into a path as it is (any other key is written by position).
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: A text without a digit, ``@`` or ``:`` cannot hold a built-in identifier (every built-in
#: pattern needs one of them); with only built-ins, such text skips Presidio altogether.
_BUILTIN_HINT = re.compile(r"[\d@:]")


def _member(path: str, key: object, i: int, plain: bool) -> str:
    """The path of member ``i`` (key ``key``) of the object at ``path``."""
    seg = str(key) if plain and isinstance(key, str) and _PLAIN_KEY.fullmatch(key) \
        else f"{{#{i}}}"
    return f"{path}.{seg}" if path else seg


def _key_path(path: str, i: int) -> str:
    """The path of the key of member ``i`` of the object at ``path``."""
    return f"{path}.{{key#{i}}}" if path else f"{{key#{i}}}"


def iter_strings(value: Any, path: str = "", *, keys: bool = True
                 ) -> Iterator[tuple[str, str]]:
    """Yield ``(path, text)`` for every string in a JSON value, depth first.

    Each object key is yielded before its value (path ``...{key#N}``, see the module
    docstring), unless ``keys`` is false; integers of six digits or more as their digits; a
    ``data:`` URL as the text it carries (binary payloads skipped). Paths here write every
    plain-identifier key (the scan writes a key holding a finding by position instead).
    """
    for _, _, _, p, text in _walk(value, (), path, keys, frozenset()):
        yield p, text


_Part = tuple[tuple[int, ...], bool, Form, str, str]  # (loc, is key, form, path, text)


def _text(value: str) -> tuple[Form, str] | None:
    """The form and text to scan of a string (``None``: nothing to scan)."""
    if not value:
        return None
    if value[:5].lower() != "data:":
        return "text", value
    found = data_url_text(value)
    if found is None:
        return None
    text, in_place = found
    return ("text" if in_place else "encoded"), text


def _walk(value: Any, loc: tuple[int, ...], path: str, keys: bool,
          hidden: frozenset[tuple[int, ...]]) -> Iterator[_Part]:
    """``(loc, is key, form, path, text)`` of every scanned text; members at a loc in
    ``hidden`` are written by position."""
    if isinstance(value, str):
        found = _text(value)
        if found is not None:
            yield loc, False, found[0], path, found[1]
            decoded = base64_text(value)
            if decoded:  # scanned as written (above) and as decoded
                yield loc, False, "encoded", path, decoded
    elif isinstance(value, dict):
        for i, (k, v) in enumerate(value.items()):
            here = (*loc, i)
            if keys and isinstance(k, str):
                found = _text(k)
                if found is not None:  # a key is never masked: its form does not matter
                    yield here, True, found[0], _key_path(path, i), found[1]
            yield from _walk(v, here, _member(path, k, i, here not in hidden), keys, hidden)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, (*loc, i), f"{path}[{i}]", keys, hidden)
    else:
        digits = number_text(value)
        if digits is not None:
            yield loc, False, "number", path, digits


class ScanStopped(Exception):
    """A scan was stopped before it finished (its ``stop`` said so: the caller gave up, or its
    deadline passed). Not a ``TimeoutError``: Presidio catches that one per pattern and goes
    on."""


#: Parts of a value between two polls of a scan's ``stop`` while their views are made.
_POLL_PARTS = 256
#: Values walked between two polls of a scan's ``stop`` (:func:`texts`).
_POLL_NODES = 1024


class _Over(Exception):
    """The walk passed its budget of characters."""


def _parts(value: Any, loc: tuple[int, ...], keys: bool,
           out: list[tuple[tuple[int, ...], bool, Form, str]],
           budget: list[int] | None = None, stop: Callable[[], bool] | None = None) -> None:
    """:func:`_walk` without paths, into ``out`` (the scan's first pass: paths are made only
    for a value with findings; a generator per level and a path per string cost ~0.8 us per
    string, this ~0.3 us). ``budget``: ``[characters left before _Over is raised, values
    left before stop() is polled]``; every value and key costs one more than its characters
    (an empty string, a ``null``, a ``[]`` cost one: a body of millions of them is not free
    to walk)."""
    if budget is not None:
        budget[0] -= len(value) + 1 if isinstance(value, str) else 1
        if budget[0] < 0:
            raise _Over
        budget[1] -= 1
        if budget[1] <= 0:
            budget[1] = _POLL_NODES
            if stop is not None and stop():
                raise ScanStopped("the scan was stopped before it finished")
    if isinstance(value, str):
        if value[:1] not in "dD":  # neither empty ("" is in any str) nor a data: URL
            out.append((loc, False, "text", value))
        else:
            found = _text(value)
            if found is not None:
                out.append((loc, False, found[0], found[1]))
        if len(value) >= 16:
            decoded = base64_text(value)
            if decoded:
                out.append((loc, False, "encoded", decoded))
    elif isinstance(value, dict):
        for i, (k, v) in enumerate(value.items()):
            here = (*loc, i)
            if keys and isinstance(k, str):
                if budget is not None:
                    budget[0] -= len(k) + 1
                    if budget[0] < 0:
                        raise _Over
                if k[:1] not in "dD":
                    out.append((here, True, "text", k))
                else:
                    found = _text(k)
                    if found is not None:
                        out.append((here, True, found[0], found[1]))
            _parts(v, here, keys, out, budget, stop)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _parts(v, (*loc, i), keys, out, budget, stop)
    elif isinstance(value, (int, float)):
        digits = number_text(value)
        if digits is not None:
            out.append((loc, False, "number", digits))


@dataclass(frozen=True, slots=True)
class Texts:
    """The texts a scan of one value reads (:func:`texts`): walked once, then handed to
    :meth:`Detector.scan` (which would otherwise walk the value again).

    Attributes:
        value: the value walked (the one to scan).
        keys: object keys included.
        chars: characters of all the texts (separators not counted).
    """

    value: Any
    keys: bool
    chars: int
    parts: list[tuple[tuple[int, ...], bool, Form, str]] = field(repr=False)


def texts(value: Any, *, keys: bool = True, limit: int | None = None,
          stop: Callable[[], bool] | None = None) -> Texts | None:
    """The texts a scan of ``value`` reads, or ``None`` as soon as they pass ``limit``
    characters (the walk stops there: deciding that a value is large costs ``limit``, not its
    size). The count is of the strings as written (a decoded ``data:`` or base64 text is never
    longer than its string), plus one per value and key (empty strings, numbers, ``null``
    and empty containers too); a decoded base64 text adds to ``chars`` beside it.

    Args:
        value: a JSON value.
        keys: object keys included.
        limit: the budget (``None``: no limit; ``stop`` is then not polled).
        stop: polled every 1024 values; when it returns true the walk ends.

    Raises:
        ScanStopped: ``stop`` returned true.
    """
    parts: list[tuple[tuple[int, ...], bool, Form, str]] = []
    try:
        _parts(value, (), keys, parts, None if limit is None else [limit, _POLL_NODES], stop)
    except _Over:
        return None
    return Texts(value, keys, sum(len(p[3]) for p in parts), parts)


def _without_overlaps(results: list[Any]) -> list[Any]:
    """Presidio's results with overlaps removed, in text order: higher score first, then
    longer; on a tie a card (Luhn: one in ten) loses to an identifier with a stronger check
    over the same digits.

    The spans kept never overlap (nor are empty: Presidio drops empty matches), so they are
    kept sorted (starts and ends both ascending) and each result is checked against its one
    possible neighbour by bisection: O(n log n) (a comparison with every kept span was
    quadratic: 10,000 e-mail addresses, 2.3 s).
    """
    starts: list[int] = []
    ends: list[int] = []
    kept: list[Any] = []
    for r in sorted(results, key=lambda r: (-r.score, r.start - r.end,
                                            r.entity_type == "CREDIT_CARD")):
        i = bisect.bisect_left(starts, r.end)  # kept spans starting before r ends: [:i]
        if i and ends[i - 1] > r.start:
            continue  # the last of them ends after r starts: they overlap
        j = bisect.bisect_left(starts, r.start)
        starts.insert(j, r.start)
        ends.insert(j, r.end)
        kept.insert(j, r)
    return kept


class Detector:
    """Finds sensitive entities in text or JSON values.

    Building one imports Presidio and spaCy (about 2 s) and compiles every recogniser: do it
    once at start-up (the gateway builds it with the policy), never per request. Thread-safe
    for concurrent :meth:`scan` calls.

    Args:
        specs: recognisers to run (default: the built-in EU identifiers).
        score_threshold: minimum score of a finding (0..1).
        language: tokenizer language for context words (spaCy blank pipeline).
        windowed_context: read context words from a window around each match
            (:mod:`policy.pii.context`, same findings); ``False``: Presidio's own enhancer over
            the whole text's words (the reference the tests compare with).

    Raises:
        KeyError: a spec names an unknown validator.
    """

    def __init__(self, specs: Sequence[RecognizerSpec] = BUILTIN, *,
                 score_threshold: float = 0.5, language: str = "en",
                 windowed_context: bool = True) -> None:
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry

        t0 = time.perf_counter()
        self._local = threading.local()  # .stop: the running scan's, in this thread
        registry = RecognizerRegistry(
            recognizers=build_recognizers(specs, self._checkpoint),
            global_regex_flags=re.DOTALL | re.MULTILINE,
            supported_languages=[language],
        )
        nlp = make_nlp_engine(language)
        nlp.load()
        self._engine = AnalyzerEngine(registry=registry, nlp_engine=nlp,
                                      supported_languages=[language],
                                      default_score_threshold=score_threshold,
                                      context_aware_enhancer=make_enhancer(self._checkpoint)
                                      if windowed_context else None)
        self._language = language
        self._threshold = score_threshold
        self._prefilter = all(s in BUILTIN for s in specs)
        self.entities: tuple[str, ...] = tuple(dict.fromkeys(s.entity for s in specs))
        self.load_s = time.perf_counter() - t0
        _log.info("PII detector ready: %d recognisers in %.2f s", len(specs), self.load_s)

    def _checkpoint(self) -> None:
        """Raise :class:`ScanStopped` when this thread's running scan was told to stop."""
        stop = getattr(self._local, "stop", None)
        if stop is not None and stop():
            raise ScanStopped("the scan was stopped before it finished")

    def scan(self, value: Any, *, keys: bool = True, walked: Texts | None = None,
             stop: Callable[[], bool] | None = None) -> list[Finding]:
        """Findings in a string or in every string of a JSON value.

        Where two findings overlap, the one with the higher score is kept (then the longer):
        a card-like run of digits inside an IBAN is not reported as a card.

        Args:
            value: a ``str`` or a JSON value (dicts, lists, strings, numbers, ...).
            keys: scan object keys too (findings with ``key`` set, path ``...{key#N}``).
            walked: :func:`texts` of this ``value`` with these ``keys``, when already made.
            stop: polled while the scan runs (every 256 texts while they are normalised,
                before each recogniser, on each match and each context lookup); when it
                returns true the scan ends with :class:`ScanStopped` (a scan left to run
                after its caller gave up costs CPU for nothing).

        Returns:
            Findings in text order (path, then offset); never the matched text, and paths
            never hold a key that has a finding (see the module docstring).

        Raises:
            ScanStopped: ``stop`` returned true.
        """
        if stop is None:
            return self._scan(value, keys, walked)
        self._local.stop = stop
        try:
            return self._scan(value, keys, walked)
        finally:
            self._local.stop = None

    def _scan(self, value: Any, keys: bool, walked: Texts | None) -> list[Finding]:
        if walked is not None and walked.value is value and walked.keys == keys:
            parts = walked.parts
        else:
            parts = []
            _parts(value, (), keys, parts)
        if not parts:
            return []
        views = []
        for i, (*_, t) in enumerate(parts):
            if i % _POLL_PARTS == 0:
                self._checkpoint()
            views.append(view(t))
        text = _JOIN.join(v.text for v in views)
        if self._prefilter and _BUILTIN_HINT.search(text) is None:
            return []
        results = self._engine.analyze(text=text, language=self._language,
                                       score_threshold=self._threshold)
        self._checkpoint()
        kept = _without_overlaps(results)
        located: list[tuple[Any, int, int]] = []  # (result, part index, part's offset)
        base, i = 0, 0
        for r in kept:
            while i < len(parts) and r.start >= base + len(views[i].text):
                base += len(views[i].text) + len(_JOIN)
                i += 1
            if i == len(parts):
                break
            located.append((r, i, base))
        if not located:
            return []
        # Paths are made only now, once it is known which keys hold a finding.
        hidden = frozenset(parts[i][0] for _, i, _ in located if parts[i][1])
        paths = {(loc, is_key): p for loc, is_key, _, p, _ in _walk(value, (), "", keys, hidden)}
        findings: list[Finding] = []
        for r, i, base in located:
            loc, is_key, form, _ = parts[i]
            start, end = views[i].span(r.start - base, r.end - base)
            findings.append(Finding(r.entity_type, paths[(loc, is_key)], start, end,
                                    float(r.score), is_key, loc, form))
        return findings
