"""Sensitive data in prompts: detection (Presidio, offline) and what the policy does with it.

Public API:

* :func:`scan` -- findings in a string or any JSON value (MCP tool arguments, a request's
  ``messages``), with the built-in recognisers or a given :class:`Detector`;
* :class:`Detector`, :class:`Finding`, :func:`mask`;
* :class:`PiiPolicy`, :class:`PiiVerdict` (the policy file's ``pii`` section, reached as
  ``Policy.pii``), :class:`PiiSection`;
* :mod:`policy.pii.checksums` (check-digit algorithms).

Module map: ``checksums`` (algorithms), ``recognizers`` (built-in and operator recognisers as
Presidio recognisers), ``engine`` (the detector, offline NLP engine, masking), ``config`` (the
policy file's section), ``inspect`` (actions, classes, fail-safe).
"""

from __future__ import annotations

import functools
from typing import Any

from .config import PiiSection
from .engine import Detector, Finding, mask
from .inspect import PiiPolicy, PiiVerdict

__all__ = ["Detector", "Finding", "PiiPolicy", "PiiSection", "PiiVerdict", "builtin_detector",
           "mask", "scan"]


@functools.cache
def builtin_detector() -> Detector:
    """The detector with the built-in recognisers, built on first use and then shared.

    Built once per process (about 2 s: Presidio and spaCy imports) because a detector is
    immutable and thread-safe; callers with a policy use ``Policy.pii.load()`` instead.
    """
    return Detector()


def scan(value: Any, detector: Detector | None = None) -> list[Finding]:
    """Findings in a string or in every string of a JSON value.

    Args:
        value: ``str`` or a JSON value (dict, list, ...); object keys are not scanned.
        detector: the detector to use (default :func:`builtin_detector`).

    Returns:
        Findings (entity type, JSON path, offsets, score), never the matched text.
    """
    return (detector or builtin_detector()).scan(value)
