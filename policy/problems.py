"""Problems of a policy file as one-line ``file:line: key: problem`` messages.

The policy package's one formatter of validation errors, in the shape of the gateway's config
errors (``gateway/config/errors.py``; the policy package is a leaf and cannot import it)::

    p.yaml:25: destinations[0].prot: unknown key (did you mean 'port'?)
    p.yaml:31: rules[1].constraints.jurisdiction: Input should be a valid string or a valid list

``key`` is the dotted path of the offending key (``[i]`` for list items, ``.name`` for mapping
keys); ``line`` is the 1-based line of that key in the file, or of its nearest parent written in
the file (a missing key is reported on the line of the mapping that lacks it). Every error of a
file is reported, one problem each, never only the first.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from clishell.problems import KeyPath, line_of, model_in, unknown_key, unwrap
from clishell.problems import dotted as _dotted

__all__ = ["KeyPath", "PolicyProblem", "dotted", "line_of", "validation_problems"]


_PREFIX = re.compile(r"^(Value error|Assertion failed), ")
_SHOULD = "Input should be "


@dataclasses.dataclass(frozen=True)
class PolicyProblem:
    """One problem of a policy file.

    Attributes:
        key: Dotted key path (``destinations[0].port``), or ``None`` for the file as a whole
            (not YAML, not a mapping, unreadable).
        problem: What is wrong, in one line.
        file: The policy file (``<string>`` for a document given as text).
        line: 1-based line of the key (or of its nearest written parent), when known.
    """

    key: str | None
    problem: str
    file: str
    line: int | None = None

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        return f"{where}: {self.key}: {self.problem}" if self.key else f"{where}: {self.problem}"

    def to_json(self) -> dict[str, str | int | None]:
        """``{"file", "line", "key", "problem"}`` (``policy check --json``)."""
        return {"file": self.file, "line": self.line, "key": self.key, "problem": self.problem}


def dotted(path: KeyPath) -> str:
    """``("rules", 0, "id")`` -> ``rules[0].id`` (``<document>`` for ``()``)."""
    return _dotted(path, "<document>")


def validation_problems(
    exc: ValidationError, *, file: str, lines: Mapping[KeyPath, int], model: type[BaseModel]
) -> list[PolicyProblem]:
    """Turn a pydantic ``ValidationError`` into one :class:`PolicyProblem` per offending key.

    Pydantic's wording is kept where it is plain ("Input should be a valid integer"), and
    replaced where it speaks Python: a missing key is ``required key is missing``, an extra key
    ``unknown key (did you mean 'port'?)`` (or with the keys known there), a list item that is
    not a mapping ``must be a mapping``. The errors of one key under a union (``str |
    list[str]``: one error per member, each located under the member's name) become one
    problem on the key itself.

    Args:
        exc: The validation error of ``model``.
        file: The policy file named in each problem.
        lines: Key path -> 1-based line of the file.
        model: The model that was validated (to tell keys from union member names).

    Returns:
        The problems in pydantic's order, one per key.
    """
    merged: dict[KeyPath, list[str]] = {}
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
        path = _key_path(model, loc)
        msg = _PREFIX.sub("", str(err["msg"]))
        if err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] == "extra_forbidden":
            msg = unknown_key(model, path) or "unknown key"
        elif err["type"] in ("model_type", "model_attributes_type", "dict_type"):
            msg = "must be a mapping"
        found = merged.setdefault(path, [])
        if msg not in found:
            found.append(msg)
    return [PolicyProblem(dotted(path), _either(msgs), file, line_of(lines, path))
            for path, msgs in merged.items()]


def _either(messages: list[str]) -> str:
    """One problem from the errors of one key: ``Input should be a valid string or a valid
    list`` (the members of a union), else the messages joined by ``; ``."""
    first, *rest = messages
    if rest and all(m.startswith(_SHOULD) for m in messages):
        return first + "".join(f" or {m.removeprefix(_SHOULD)}" for m in rest)
    return "; ".join(messages)


def _key_path(model: type[BaseModel], loc: KeyPath) -> KeyPath:
    """``loc`` without the union member names pydantic puts in it (``jurisdiction.str``)."""
    out: list[str | int] = []
    current: Any = model
    for part in loc:
        if current is not None and _is_member_tag(current, part):
            continue  # stay on the union: the next part (if any) is inside this member
        out.append(part)
        current = unwrap(current, part) if current is not None else None
    return tuple(out)


def _is_member_tag(annotation: Any, part: str | int) -> bool:
    """Whether ``part`` names a member of the union ``annotation`` rather than a key in it."""
    if not isinstance(part, str) or typing.get_origin(annotation) not in (
            typing.Union, types.UnionType):
        return False
    for arg in typing.get_args(annotation):
        found = model_in(arg)
        if found is not None and any(part in (n, f.alias) for n, f in found.model_fields.items()):
            return False  # a key of a model member (``X | None``)
    return True
