"""What the policy does with a detection: the request's class, masking, refusal, records.

:class:`PiiPolicy` is built by :class:`policy.Policy` from the ``pii`` section. Its detector is
built on the first :meth:`PiiPolicy.load` (Presidio and spaCy imports, about 2 s), which the
gateway calls at start-up; :meth:`PiiPolicy.inspect` then scans a value, and decides each
finding's action by the section's rules (first rule that applies, else ``default_action``):

* ``raise``: the request's class becomes the most sensitive of its class and the classes the
  findings imply (``entity_classes``, else ``default_class``, else the policy's most sensitive
  class), so routing and egress follow the raised class;
* ``mask``: the finding is replaced by ``<ENTITY>`` in what is forwarded; a finding that cannot
  be masked where it is (:attr:`~policy.pii.engine.Finding.maskable`) fails closed: the
  request is refused as for ``refuse`` (the verdict records that entity type's action as
  ``refuse``). That is a finding in an object key (an MCP argument's name: masking changes the
  object's shape, and a masked key may collide with a sibling), in a number (a placeholder is
  not a number), in an encoded ``data:`` URL, or in a string the caller marks as structural
  (``fixed``: a function name, a schema's ``enum``...);
* ``refuse``: :class:`~policy.errors.PiiRefused` names the entity types, never the values;
* ``record``: only the record.

A scan that did not finish (a detector error, a scan longer than ``timeout_s``, a text longer
than ``max_scan_chars``, a scan the pool refused: :meth:`PiiPolicy.inspect_async`) never leaves
a request at a lower class, or less masked, than a finished scan could have
(:meth:`PiiPolicy.unscanned`): it is decided as if every entity type a recogniser can find had
been found. A class in ``fail_closed_classes``, or a request for which a ``mask`` or
``refuse`` action could apply (it cannot be masked or checked unscanned), is refused
(:class:`~policy.errors.PiiScanFailed`); any other request gets the most sensitive class its
``raise`` actions could give it, the error recorded. Long scans run in the section's
:class:`~policy.pii.pool.ScanPool` (bounded, fair between keys, stopped at their deadline).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import PiiRefused, PiiScanFailed
from .config import Action, PiiRule, PiiSection
from .engine import Detector, Finding, ScanStopped, Texts, mask, texts
from .pool import ScanPool, ScanRejected
from .recognizers import BUILTIN, RecognizerSpec

__all__ = ["Fixed", "PiiPolicy", "PiiVerdict"]

#: Marks findings the caller cannot let be masked (structural strings of its format).
Fixed = Callable[[Finding], bool]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PiiVerdict:
    """The outcome of one inspection (what the audit record and the metrics carry).

    Attributes:
        findings: every finding above the threshold (no matched text).
        class_before: the request's class before detection.
        class_after: its class after ``raise`` actions.
        actions: entity type -> action applied.
        rules: entity type -> id of the rule that decided (``None``: ``default_action``).
        error: why the scan did not finish when the request still passes (``None``: the scan
            ran); ``class_after`` is then the most sensitive class a finished scan could have
            given (:meth:`PiiPolicy.unscanned`).
        duration_s: time the scan took (seconds).
    """

    findings: tuple[Finding, ...]
    class_before: str
    class_after: str
    actions: dict[str, Action] = field(default_factory=dict)
    rules: dict[str, str | None] = field(default_factory=dict)
    error: str | None = None
    duration_s: float = 0.0
    reversible: frozenset[str] = frozenset()  # masked entity types mapped back in the answer

    @property
    def refused(self) -> tuple[str, ...]:
        """Entity types whose action is ``refuse``, sorted."""
        return tuple(sorted(e for e, a in self.actions.items() if a == "refuse"))

    @property
    def to_mask(self) -> tuple[Finding, ...]:
        """Findings whose action is ``mask``."""
        return tuple(f for f in self.findings if self.actions.get(f.entity) == "mask")

    def counts(self) -> dict[str, int]:
        """Entity type -> number of findings."""
        return dict(Counter(f.entity for f in self.findings))

    def as_record(self) -> dict[str, Any]:
        """The JSON-ready audit form: types, counts, classes, actions; never matched text.

        ``in_keys`` (entity type -> findings in object keys) is present when a key held one;
        ``unmaskable`` (entity type -> findings in numbers, encoded payloads or structural
        strings) when one of those held one.
        """
        extra: dict[str, Any] = {"reversible": sorted(self.reversible)} if self.reversible else {}
        in_keys = Counter(f.entity for f in self.findings if f.key)
        if in_keys:
            extra["in_keys"] = dict(in_keys)
        fixed = Counter(f.entity for f in self.findings if not f.key and not f.maskable)
        if fixed:
            extra["unmaskable"] = dict(fixed)
        return {**extra,
            "entities": self.counts(),
            "actions": dict(self.actions),
            "rules": dict(self.rules),
            "class_before": self.class_before,
            "class_after": self.class_after,
            "error": self.error,
            "scan_us": round(self.duration_s * 1_000_000),
        }


def _rule_applies(rule: PiiRule, key: str, team: str | None, data_class: str,
                  entity: str) -> bool:
    if (rule.keys or rule.teams) and key not in rule.keys and (
            team is None or team not in rule.teams):
        return False
    if rule.classes is not None and data_class not in rule.classes:
        return False
    return rule.entities is None or entity in rule.entities


class PiiPolicy:
    """The ``pii`` section, bound to the policy's data classes (see the module docstring).

    Args:
        section: the validated section.
        classes: the policy's data classes, least to most sensitive.
        detector_factory: builds the detector from recogniser specs (a seam for tests that
            make the detector fail; default :class:`Detector`).
    """

    def __init__(self, section: PiiSection, classes: Sequence[str], *,
                 detector_factory: Callable[..., Detector] | None = None) -> None:
        self.section = section
        self.classes = tuple(classes)
        self._rank = {c: i for i, c in enumerate(self.classes)}
        self._factory = detector_factory or Detector
        self._detector: Detector | None = None
        self._lock = threading.Lock()
        specs: list[RecognizerSpec] = list(BUILTIN) if section.builtin else []
        for r in section.recognizers:
            specs.append(RecognizerSpec(
                r.entity, tuple((p.regex, p.score) for p in r.patterns), tuple(r.context),
                r.validator, r.validated_score, r.ignore_case,
                name=f"operator_{r.entity.lower()}"))
        self.specs = tuple(specs)
        #: Entity types a recogniser can find (what an unfinished scan may have missed).
        self.entities = tuple(dict.fromkeys(s.entity for s in specs))
        self.fail_closed = frozenset(section.fail_closed_classes)
        self.pool = ScanPool(section.scan_threads, section.scan_queue)

    def load(self) -> Detector:
        """Build the detector once (imports Presidio; call at start-up) and return it."""
        with self._lock:
            if self._detector is None:
                self._detector = self._factory(self.specs,
                                               score_threshold=self.section.score_threshold)
            return self._detector

    def implied_class(self, entity: str) -> str:
        """The data class a finding of ``entity`` implies."""
        return (self.section.entity_classes.get(entity) or self.section.default_class
                or self.classes[-1])

    def decide(self, findings: Sequence[Finding], key: str, team: str | None,
               data_class: str, *, duration_s: float = 0.0) -> PiiVerdict:
        """Each finding's action and the request's class after it (no scan)."""
        actions: dict[str, Action] = {}
        rules: dict[str, str | None] = {}
        raised = data_class
        reversible: set[str] = set()
        for f in findings:
            if f.entity in actions:
                continue
            rule = next((r for r in self.section.rules
                         if _rule_applies(r, key, team, data_class, f.entity)), None)
            action: Action = rule.action if rule is not None else self.section.default_action
            actions[f.entity] = action
            rules[f.entity] = rule.id if rule is not None else None
            if action == "mask" and (rule.reversible if rule is not None
                                     else self.section.mask_reversible):
                reversible.add(f.entity)
            if action == "raise":
                implied = self.implied_class(f.entity)
                if self._rank.get(implied, -1) > self._rank.get(raised, -1):
                    raised = implied
        return PiiVerdict(tuple(findings), data_class, raised, actions, rules,
                          duration_s=duration_s, reversible=frozenset(reversible))

    def unscanned(self, why: str, key: str, team: str | None, data_class: str,
                  duration_s: float = 0.0) -> PiiVerdict:
        """The decision for a request whose scan did not finish: as if every entity type a
        recogniser can find had been found (a scan that did not finish never leaves a
        request at a lower class, or less masked, than a finished one could have).

        Args:
            why: what happened, for the record and the error (``"timed out"``, ...).
            key: the caller's key id.
            team: the caller's team.
            data_class: the request's class before detection.
            duration_s: time spent before giving up (seconds).

        Returns:
            No findings, ``class_after`` the most sensitive class the ``raise`` actions that
            could apply give, ``error`` ``"scan <why>"``.

        Raises:
            PiiScanFailed: ``data_class`` is in ``fail_closed_classes``, or a ``mask`` or
                ``refuse`` action could apply to this request (it cannot be masked or checked
                unscanned); the message names the entity types, never a value.
        """
        if data_class in self.fail_closed:
            raise PiiScanFailed(
                f"The sensitive-data scan {why}; the policy refuses unscanned requests of "
                f"class {data_class!r}.")
        worst = self.decide([_anywhere(e) for e in self.entities], key, team, data_class)
        stopping = sorted(e for e, a in worst.actions.items() if a in ("mask", "refuse"))
        if stopping:
            raise PiiScanFailed(
                f"The sensitive-data scan {why}; the policy masks or refuses "
                f"{', '.join(stopping)} in this request, which cannot be done unscanned.")
        _log.warning("PII scan %s for key %s: class %s taken as %s (as if every entity had "
                     "been found)", why, key, data_class, worst.class_after)
        return PiiVerdict((), data_class, worst.class_after, error=f"scan {why}",
                          duration_s=duration_s)

    def _failed(self, exc: BaseException, key: str, team: str | None, data_class: str,
                duration_s: float) -> PiiVerdict:
        if isinstance(exc, (TimeoutError, ScanStopped)):
            why = "timed out"
        elif isinstance(exc, ScanRejected):
            why = f"not started ({exc})"
        elif isinstance(exc, _TooLarge):
            why = "skipped (text over pii.max_scan_chars)"
        else:
            why = f"failed ({type(exc).__name__})"
        try:
            return self.unscanned(why, key, team, data_class, duration_s)
        except PiiScanFailed as failed:
            raise failed from exc

    def inspect(self, value: Any, key: str, team: str | None, data_class: str,
                fixed: Fixed | None = None) -> PiiVerdict:
        """Scan ``value`` and decide (synchronously, no timeout; see :meth:`inspect_async`).

        Args:
            value: a string or JSON value (every string, key and long integer is scanned).
            key: the caller's key id (rules by key).
            team: the caller's team (rules by team).
            data_class: the request's class before detection.
            fixed: marks findings in strings that must not be masked (form ``fixed``: a
                ``mask`` action on them refuses instead).

        Raises:
            PiiRefused: a finding's action is ``refuse``.
            PiiScanFailed: the detector failed and ``data_class`` fails closed.
        """
        return self._inspect(value, key, team, data_class, fixed, None)

    def _inspect(self, value: Any, key: str, team: str | None, data_class: str,
                 fixed: Fixed | None, walked: Texts | None) -> PiiVerdict:
        t0 = time.perf_counter()
        try:
            detector = self.load()
            findings = detector.scan(value) if walked is None else detector.scan(
                value, walked=walked)
        except Exception as exc:  # fail-safe: any detector failure is decided by policy
            return self._failed(exc, key, team, data_class, time.perf_counter() - t0)
        return self._checked(self.decide(_fix(findings, fixed), key, team, data_class,
                                         duration_s=time.perf_counter() - t0))

    async def inspect_async(self, value: Any, key: str, team: str | None,
                            data_class: str, fixed: Fixed | None = None) -> PiiVerdict:
        """:meth:`inspect` in the scan pool, bounded by ``timeout_s``.

        Text up to ``inline_max_chars`` is scanned inline instead (its cost is bounded by its
        size, and a thread hop costs more than the scan). A longer text is scanned in the
        section's :class:`~policy.pii.pool.ScanPool` under ``key`` (walked there: a text
        over ``max_scan_chars`` is not scanned), stopped at ``timeout_s``. A scan that does
        not finish is decided by :meth:`unscanned`.

        Raises:
            PiiRefused: a finding's action is ``refuse``.
            PiiScanFailed: the scan did not finish and the request cannot pass unscanned
                (:meth:`unscanned`).
        """
        walked = self._small(value)
        if walked is not None:
            return self._inspect(value, key, team, data_class, fixed, walked)
        t0 = time.perf_counter()
        try:
            findings = await self._pooled(value, key)
        except Exception as exc:  # TimeoutError included
            return self._failed(exc, key, team, data_class, time.perf_counter() - t0)
        return self._checked(self.decide(_fix(findings, fixed), key, team, data_class,
                                         duration_s=time.perf_counter() - t0))

    async def _pooled(self, value: Any, key: str, *, keys: bool = True) -> list[Finding]:
        """``value``'s findings, scanned in the pool for ``key`` within ``timeout_s``.

        Raises:
            TimeoutError, ScanStopped: not done within ``timeout_s``.
            ScanRejected: the pool refused the scan.
            _TooLarge: the texts pass ``max_scan_chars``.
        """
        detector = self.load()
        limit = self.section.max_scan_chars

        def scan(stop: Callable[[], bool]) -> list[Finding]:
            walked = texts(value, keys=keys, limit=limit, stop=stop)
            if walked is None:
                raise _TooLarge
            return detector.scan(value, keys=keys, walked=walked, stop=stop)

        findings: list[Finding] = await self.pool.run(key, scan, self.section.timeout_s)
        return findings

    def _small(self, value: Any) -> Texts | None:
        """``value``'s texts when they are short enough to scan inline (``inline_max_chars``;
        walked once for the decision and the scan), else ``None``."""
        return texts(value, limit=self.section.inline_max_chars)

    @staticmethod
    def _checked(verdict: PiiVerdict) -> PiiVerdict:
        stuck = [f for f in verdict.to_mask if not f.maskable]
        if stuck:
            # Fail closed: a key, a number, ... cannot be masked (see the module docstring).
            entities = {f.entity for f in stuck}
            verdict = dataclasses.replace(verdict, actions={
                e: "refuse" if e in entities else a for e, a in verdict.actions.items()})
            raise PiiRefused(verdict.refused, verdict, in_key=all(f.key for f in stuck),
                             unmaskable=True)
        if verdict.refused:
            raise PiiRefused(verdict.refused, verdict)
        return verdict

    async def scan_async(self, value: Any, key: str = "") -> tuple[dict[str, int], str | None]:
        """Entity counts in ``value`` (a response's text), bounded by ``timeout_s`` (a longer
        text in the scan pool, under ``key``).

        Returns:
            ``(entity type -> count, error)``; error is ``"scan timed out"``, ``"scan not
            started (...)"``, ``"scan skipped (...)"`` or ``"scan failed (...)"`` when the
            detector did not finish (counts then empty).
        """
        try:
            walked = self._small(value)
            if walked is not None:
                findings = self.load().scan(value, walked=walked)
            else:
                findings = await self._pooled(value, key)
        except (TimeoutError, ScanStopped):
            return {}, "scan timed out"
        except ScanRejected as exc:
            return {}, f"scan not started ({exc})"
        except _TooLarge:
            return {}, "scan skipped (text over pii.max_scan_chars)"
        except Exception as exc:
            return {}, f"scan failed ({type(exc).__name__})"
        return dict(Counter(f.entity for f in findings)), None

    @staticmethod
    def masked(value: Any, verdict: PiiVerdict) -> Any:
        """``value`` with the verdict's ``mask`` findings replaced by ``<ENTITY>``."""
        return mask(value, verdict.to_mask)


class _TooLarge(Exception):
    """The texts of a value pass ``max_scan_chars``: not scanned."""


def _anywhere(entity: str) -> Finding:
    """A stand-in finding of ``entity`` (what :meth:`PiiPolicy.unscanned` decides by)."""
    return Finding(entity, "", 0, 0, 1.0)


def _fix(findings: list[Finding], fixed: Fixed | None) -> list[Finding]:
    """``findings`` with those ``fixed`` marks in form ``fixed`` (text findings only)."""
    if fixed is None:
        return findings
    return [dataclasses.replace(f, form="fixed") if f.form == "text" and not f.key and fixed(f)
            else f for f in findings]
