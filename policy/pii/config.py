"""The ``pii`` section of the policy file: recognisers, the class each entity implies, actions.

::

    pii:
      score_threshold: 0.5           # Presidio score a finding needs (0..1)
      timeout_s: 0.05                # a scan taking longer counts as a detector failure
      inline_max_chars: 8192         # texts up to this size are scanned on the event loop
                                     # (~0.5-2 ms per 4 KB, cheaper than a thread hop); longer
                                     # ones in a worker thread bounded by timeout_s
      max_scan_chars: 1048576        # longer texts are not scanned at all (a failed scan)
      scan_threads: 2                # worker threads for the longer scans (one key: all but one)
      scan_queue: 32                 # scans waiting for a thread (one key: a quarter)
      fail_closed_classes: [public]  # a failed scan refuses requests of these classes (503);
                                     # others are decided as if every entity had been found
                                     # (docs/pii.md, "Fail-safe")
      default_class: personal        # class a finding implies unless entity_classes names it
      entity_classes: {EMAIL_ADDRESS: internal, IP_ADDRESS: internal}
      default_action: raise          # raise | mask | refuse | record
      rules:                         # first rule that applies decides a finding's action
        - {id: no-cards, entities: [CREDIT_CARD], action: refuse}
        - {id: lab-mask, keys: [lab], classes: [public], action: mask}
      builtin: true                  # the built-in EU recognisers (IBAN, cards, national ids...)
      responses: record              # off | record | mask: scan or mask what the model answered
      response_max_bytes: 1048576    # response bytes kept for that scan (beyond: not scanned)
      response_hold_chars: 64        # mask: text held back per streamed choice
      recognizers:                   # the operator's own
        - entity: EMPLOYEE_ID
          patterns: [{regex: "\\bEMP-\\d{6}\\b", score: 0.4}]
          context: [employee, personnel]
          validator: luhn            # optional: a check from policy.pii.recognizers.VALIDATORS
          validated_score: 0.9

Actions: ``raise`` lifts the request's data class to the class the entity implies (routing and
egress then follow the raised class); ``mask`` replaces the match with ``<ENTITY>`` before the
request is forwarded (the class is not raised: the value does not leave); ``refuse`` answers a
4xx naming the entity type, never the value; ``record`` only records.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .recognizers import VALIDATORS

__all__ = ["Action", "OperatorPattern", "OperatorRecognizer", "PiiRule", "PiiSection"]

Action = Literal["raise", "mask", "refuse", "record"]
Entity = Annotated[str, Field(pattern=r"^[A-Z][A-Z0-9_]{1,63}$")]
RuleId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")]
Score = Annotated[float, Field(ge=0.0, le=1.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True)


class OperatorPattern(_Strict):
    """One regular expression of an operator's recogniser (Python ``re`` syntax)."""

    regex: str = Field(min_length=1)
    score: Score = 0.5

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value


class OperatorRecognizer(_Strict):
    """A recogniser the operator defines: patterns, context words and an optional check."""

    entity: Entity
    patterns: list[OperatorPattern] = Field(min_length=1)
    context: list[str] = Field(default_factory=list)
    validator: str | None = None
    validated_score: Score = 1.0
    ignore_case: bool = False

    @field_validator("validator")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value is not None and value not in VALIDATORS:
            known = ", ".join(sorted(VALIDATORS))
            raise ValueError(f"unknown validator {value!r} (known: {known})")
        return value


class PiiRule(_Strict):
    """Which action a finding gets: by key or team, by the request's class, by entity type.

    Every selector left out matches everything; the first rule that applies decides.
    """

    id: RuleId
    keys: list[str] = Field(default_factory=list)
    teams: list[str] = Field(default_factory=list)
    classes: list[str] | None = None
    entities: list[Entity] | None = None
    action: Action
    reversible: bool = False  # mask: numbered placeholders, mapped back in the response


class PiiSection(_Strict):
    """The policy file's ``pii`` section (see the module docstring)."""

    enabled: bool = True
    builtin: bool = True
    score_threshold: Score = 0.5
    timeout_s: float = Field(default=0.05, gt=0.0, le=10.0)
    inline_max_chars: int = Field(default=8192, ge=0)
    max_scan_chars: int = Field(default=1_048_576, ge=1)
    scan_threads: int = Field(default=2, ge=1, le=64)
    scan_queue: int = Field(default=32, ge=0, le=4096)
    fail_closed_classes: list[str] = Field(default_factory=list)
    default_class: str | None = None
    entity_classes: dict[Entity, str] = Field(default_factory=dict)
    default_action: Action = "raise"
    mask_reversible: bool = False  # default_action mask: numbered placeholders, mapped back
    rules: list[PiiRule] = Field(default_factory=list)
    recognizers: list[OperatorRecognizer] = Field(default_factory=list)
    responses: Literal["off", "record", "mask"] = "off"
    response_max_bytes: int = Field(default=1_048_576, ge=1024)
    response_hold_chars: int = Field(default=64, ge=16, le=4096)

    @model_validator(mode="after")
    def _unique_rules(self) -> PiiSection:
        ids = [r.id for r in self.rules]
        if len(set(ids)) != len(ids):
            raise ValueError("pii rule ids must be unique")
        return self

    def classes_named(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Every data class the section names, with its key path (checked by the loader)."""
        out: list[tuple[tuple[str | int, ...], str]] = []
        for i, c in enumerate(self.fail_closed_classes):
            out.append((("pii", "fail_closed_classes", i), c))
        if self.default_class is not None:
            out.append((("pii", "default_class"), self.default_class))
        for e, c in self.entity_classes.items():
            out.append((("pii", "entity_classes", e), c))
        for i, r in enumerate(self.rules):
            for j, c in enumerate(r.classes or ()):
                out.append((("pii", "rules", i, "classes", j), c))
        return out
