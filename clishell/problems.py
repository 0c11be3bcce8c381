"""Locating a problem in a YAML file: key paths, their lines, and pydantic's unknown keys.

The one shared leaf of the two formatters of ``file:line: key: problem`` messages: the
gateway's config problems (:mod:`gateway.config.errors`) and the policy file's
(:mod:`policy.problems`). ``key`` is the dotted path of the offending key (``[i]`` for list
items, ``.name`` for mapping keys); ``line`` is the 1-based line of that key in the file, or
of its nearest parent written in the file.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

__all__ = ["KeyPath", "dotted", "keys_at", "line_of", "model_in", "unknown_key", "unwrap"]

KeyPath = tuple[str | int, ...]
"""A key's place in a document: mapping keys (``str``) and list indexes (``int``)."""


def dotted(path: KeyPath, top: str = "(top level)") -> str:
    """``("models", 0, "url")`` -> ``models[0].url``; ``top`` for ``()``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or top


def line_of(lines: Mapping[KeyPath, int] | None, path: KeyPath) -> int | None:
    """Line of ``path`` or of its nearest parent present in ``lines`` (``None``: unknown)."""
    if not lines:
        return None
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def model_in(annotation: Any) -> type[BaseModel] | None:
    """``annotation`` if it is a pydantic model, else the first model of a union (``X | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                return arg
    return None


def unwrap(annotation: Any, part: str | int) -> Any:
    """The annotation that ``part`` of a location leads to inside ``annotation``, or ``None``.

    Follows a model's field (by name or alias), a list's or set's item, a dict's value, a
    union member named by its class (pydantic puts the member's name in the location), and any
    member of a union; ``Annotated`` is looked through.
    """
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    found = model_in(annotation)
    if found is not None and isinstance(part, str):
        for name, field in found.model_fields.items():
            if part in (name, field.alias):
                return field.annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset) and args and isinstance(part, int):
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    if isinstance(part, str):  # a union member's tag
        for arg in args:
            member = model_in(arg)
            if member is not None and member.__name__ == part:
                return member
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            inner = unwrap(arg, part)
            if inner is not None:
                return inner
    return None


def keys_at(model: type[BaseModel], loc: Sequence[Any]) -> list[str] | None:
    """The keys (field names or aliases) of the model found by following ``loc`` from
    ``model`` (see :func:`unwrap`), or ``None`` when ``loc`` leads to no model."""
    current: Any = model
    for part in loc:
        current = unwrap(current, part)
        if current is None:
            return None
    found = model_in(current)
    if found is None:
        return None
    return [field.alias or name for name, field in found.model_fields.items()]


def unknown_key(model: type[BaseModel], loc: Sequence[Any]) -> str | None:
    """``unknown key (did you mean 'x'?)`` for the extra key at ``loc`` of ``model``, or with
    the known keys; ``None`` when the mapping that holds it is not a model."""
    known = keys_at(model, loc[:-1])
    if not known:
        return None
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key (known here: {', '.join(known)})"
