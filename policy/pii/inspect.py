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

A detector error, or a scan longer than ``timeout_s`` (:meth:`PiiPolicy.inspect_async`), fails
closed (:class:`~policy.errors.PiiScanFailed`) for the classes in ``fail_closed_classes`` and
open (the request passes, the error recorded) for the others.
"""

from __future__ import annotations

import asyncio
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
from .engine import Detector, Finding, Texts, mask, texts
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
        error: the detector's failure when it failed open (``None``: the scan ran).
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
        self.fail_closed = frozenset(section.fail_closed_classes)

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

    def _failed(self, exc: BaseException, key: str, data_class: str,
                duration_s: float) -> PiiVerdict:
        what = "timed out" if isinstance(exc, TimeoutError) else f"failed ({type(exc).__name__})"
        if data_class in self.fail_closed:
            raise PiiScanFailed(
                f"The sensitive-data scan {what}; the policy refuses unscanned requests of "
                f"class {data_class!r}.") from exc
        _log.warning("PII scan %s for key %s (class %s): request passes unscanned", what, key,
                     data_class)
        return PiiVerdict((), data_class, data_class, error=f"scan {what}",
                          duration_s=duration_s)

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
            return self._failed(exc, key, data_class, time.perf_counter() - t0)
        return self._checked(self.decide(_fix(findings, fixed), key, team, data_class,
                                         duration_s=time.perf_counter() - t0))

    async def inspect_async(self, value: Any, key: str, team: str | None,
                            data_class: str, fixed: Fixed | None = None) -> PiiVerdict:
        """:meth:`inspect` in a worker thread, bounded by ``timeout_s``.

        Text up to ``inline_max_chars`` is scanned inline instead (its cost is bounded by its
        size, and a thread hop costs more than the scan); a longer scan still running at the
        timeout is abandoned (its thread finishes on its own; the result is dropped) and
        counts as a detector failure.

        Raises:
            PiiRefused: a finding's action is ``refuse``.
            PiiScanFailed: the detector failed or timed out and ``data_class`` fails closed.
        """
        walked = self._small(value)
        if walked is not None:
            return self._inspect(value, key, team, data_class, fixed, walked)
        t0 = time.perf_counter()
        detector = self.load()
        try:
            async with asyncio.timeout(self.section.timeout_s):
                findings = await asyncio.to_thread(detector.scan, value)
        except Exception as exc:  # TimeoutError included
            return self._failed(exc, key, data_class, time.perf_counter() - t0)
        return self._checked(self.decide(_fix(findings, fixed), key, team, data_class,
                                         duration_s=time.perf_counter() - t0))

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

    async def scan_async(self, value: Any) -> tuple[dict[str, int], str | None]:
        """Entity counts in ``value`` (a response's text), bounded by ``timeout_s``.

        Returns:
            ``(entity type -> count, error)``; error is ``"scan timed out"`` or
            ``"scan failed (...)"`` when the detector did not finish (counts then empty).
        """
        detector = self.load()
        try:
            walked = self._small(value)
            if walked is not None:
                findings = detector.scan(value, walked=walked)
            else:
                async with asyncio.timeout(self.section.timeout_s):
                    findings = await asyncio.to_thread(detector.scan, value)
        except TimeoutError:
            return {}, "scan timed out"
        except Exception as exc:
            return {}, f"scan failed ({type(exc).__name__})"
        return dict(Counter(f.entity for f in findings)), None

    @staticmethod
    def masked(value: Any, verdict: PiiVerdict) -> Any:
        """``value`` with the verdict's ``mask`` findings replaced by ``<ENTITY>``."""
        return mask(value, verdict.to_mask)


def _fix(findings: list[Finding], fixed: Fixed | None) -> list[Finding]:
    """``findings`` with those ``fixed`` marks in form ``fixed`` (text findings only)."""
    if fixed is None:
        return findings
    return [dataclasses.replace(f, form="fixed") if f.form == "text" and not f.key and fixed(f)
            else f for f in findings]
