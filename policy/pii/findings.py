"""A finding: one detected entity, located in a JSON value, never carrying the matched text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Finding", "Form"]

#: Where a finding's text is: ``text`` (a string, as written), ``number`` (an integer's
#: digits), ``encoded`` (a ``data:`` URL's decoded payload), ``fixed`` (a string the caller
#: marked as structural, see :meth:`policy.pii.PiiPolicy.inspect`).
Form = Literal["text", "number", "encoded", "fixed"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One detected entity, located but never carrying the matched text.

    Attributes:
        entity: entity type (``IBAN_CODE``, ``DE_TAX_ID``, an operator's type, ...).
        path: JSON path of the string it is in (``messages[0].content``; ``""`` for plain text;
            the form in the module docstring: never a key's text unless a plain identifier).
        start: offset of its first character in that string (code points).
        end: offset just past its last character.
        score: Presidio's confidence after check digits and context words (0..1).
        key: the string is an object key (path ``...{key#N}``), not a value.
        loc: the string's position: one index per level (list item, or member in the object's
            order); what :func:`mask` matches on (not compared, not recorded).
        form: how the scanned text stands in the value (:data:`Form`); offsets are in the
            scanned text (the decoded payload for ``encoded``).
    """

    entity: str
    path: str
    start: int
    end: int
    score: float
    key: bool = False
    loc: tuple[int, ...] = field(default=(), compare=False, repr=False)
    form: Form = "text"

    @property
    def maskable(self) -> bool:
        """Whether :func:`mask` can replace the match where it is (a value's text as written;
        not a key, a number, an encoded payload or a structural string)."""
        return not self.key and self.form == "text"

    def as_record(self) -> dict[str, Any]:
        """The JSON-ready form (no text of the match; ``key: true`` for a finding in a key,
        ``form`` when not ``text``)."""
        extra: dict[str, Any] = {"key": True} if self.key else {}
        if self.form != "text":
            extra["form"] = self.form
        return {"entity": self.entity, "path": self.path, "start": self.start,
                "end": self.end, "score": round(self.score, 3), **extra}
