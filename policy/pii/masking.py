"""Masking: a JSON value with findings' spans replaced, where they were found.

Findings are matched by their location (:attr:`policy.pii.engine.Finding.loc`), not their path;
a finding that cannot be masked where it is (:attr:`~policy.pii.engine.Finding.maskable`) is an
error here, which :class:`policy.pii.PiiPolicy` turns into a refusal before masking.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .findings import Finding

__all__ = ["Label", "mask"]

#: ``(entity type, matched text) -> replacement`` for :func:`mask`.
Label = Callable[[str, str], str]


def mask(value: Any, findings: Sequence[Finding], *, label: Label | None = None) -> Any:
    """Return ``value`` with every finding's span replaced by ``<ENTITY>``.

    Findings are matched by their location (:attr:`Finding.loc`), not their path.

    Args:
        value: the string or JSON value the findings were made on (not changed).
        findings: findings of :meth:`policy.pii.Detector.scan` on that value (only those to mask).
        label: makes each replacement instead of ``<ENTITY>`` (numbered placeholders).

    Returns:
        A new value of the same shape (strings without findings are the same objects).

    Raises:
        ValueError: a finding cannot be masked where it is (:attr:`Finding.maskable`: an object
            key, whose masking would change the object's shape; a number; an encoded payload;
            a structural string): :class:`policy.pii.PiiPolicy` refuses such a request.
    """
    if not all(f.maskable for f in findings):
        raise ValueError("a finding in an object key, a number, an encoded payload or a "
                         "structural string cannot be masked")
    by_loc: dict[tuple[int, ...], list[Finding]] = {}
    for f in findings:
        by_loc.setdefault(f.loc, []).append(f)
    return _mask(value, (), by_loc, label) if by_loc else value


def _replace_spans(text: str, spans: Sequence[Finding], label: Label | None) -> str:
    out, last = [], 0
    for f in sorted(spans, key=lambda f: f.start):
        out.append(text[last:f.start])
        out.append(label(f.entity, text[f.start:f.end]) if label else f"<{f.entity}>")
        last = f.end
    out.append(text[last:])
    return "".join(out)


def _mask(value: Any, loc: tuple[int, ...], by_loc: dict[tuple[int, ...], list[Finding]],
          label: Label | None) -> Any:
    if isinstance(value, str):
        spans = by_loc.get(loc)
        return _replace_spans(value, spans, label) if spans else value
    if isinstance(value, dict):
        return {k: _mask(v, (*loc, i), by_loc, label) for i, (k, v) in enumerate(value.items())}
    if isinstance(value, list):
        return [_mask(v, (*loc, i), by_loc, label) for i, v in enumerate(value)]
    return value
