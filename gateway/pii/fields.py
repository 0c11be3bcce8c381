"""What of a request body the ``pii`` section scans, and which strings it must not mask.

Everything the body carries upstream is scanned (:func:`scanned`): every string value and
object key at any depth (chat ``messages`` and every content part, ``tools`` with their names,
descriptions and JSON-schema parameters, ``tool_choice``, legacy ``functions`` and
``function_call``, ``response_format`` and Responses ``text.format``, ``metadata``, ``user``,
``prediction``, ``stop``, ``logit_bias`` keys, vLLM's ``guided_*`` and ``structured_outputs``,
any field this list does not know), integers of six digits or more and floats whose value is
such an integer (:func:`policy.pii.normalize.number_text`), and the text a ``data:``
URL carries (:mod:`policy.pii.dataurl`). Left out, with why:

* :data:`NOT_SCANNED` -- the top-level ``model``: the replica never receives the client's
  text, the relay writes the served model's name in its place
  (:meth:`gateway.relay.rewrite.ParsedBody.upstream_body`), and an unknown name is answered 404;
* numbers below six digits, floats with a fraction, booleans and ``null``: no identifier
  fits in them (``temperature``, ``max_tokens``, ``logit_bias`` values...);
* binary ``data:`` payloads (images, audio): :mod:`policy.pii.dataurl`.

A finding is masked where it was found, except where masking would corrupt the request's
structure (:func:`is_structural`); there a ``mask`` action refuses the request (403
``pii_refused``) instead:

* object keys (a masked key changes the object's shape and can collide with a sibling; a
  ``logit_bias`` key is a token id), numbers and encoded ``data:`` payloads (the engine's
  rule, :attr:`policy.pii.Finding.maskable`);
* ``role`` and ``type`` values: the API's own vocabularies, which select how the rest is read;
* function names (``name`` beside a ``type``, or under ``function``, ``function_call``,
  ``tool_choice``, ``json_schema``, or an item of ``tools``/``functions``): a tool call, a
  ``tool_choice`` and a tool definition refer to each other by name, and a masked name breaks
  the reference (and the name's ``[A-Za-z0-9_-]`` pattern);
* references between messages: ``tool_call_id``, ``call_id``, ``previous_response_id``;
* JSON-schema keywords whose strings are structure: ``enum``, ``const``, ``required`` (names
  of properties), ``$ref``, ``pattern`` (a regular expression); vLLM's ``guided_choice``,
  ``guided_regex``, ``guided_grammar`` and ``structured_outputs.choice``/``regex``/
  ``grammar``: a masked choice or pattern changes what the model may answer.

A keyword counts as a schema keyword unless it is the name of a property (a member of
``properties``, ``$defs``, ``definitions``, ``patternProperties``).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from gateway.errors import InvalidRequest

__all__ = ["NOT_SCANNED", "check_unique_keys", "is_structural", "scanned"]

#: Top-level members never scanned (see the module docstring).
NOT_SCANNED = frozenset({"model"})

_VOCABULARY = frozenset({"role", "type"})
_REFERENCES = frozenset({"tool_call_id", "call_id", "previous_response_id"})
_SCHEMA_WORDS = frozenset({"enum", "const", "required", "$ref", "pattern"})
_GUIDED = frozenset({"guided_choice", "guided_regex", "guided_grammar"})
_STRUCTURED = frozenset({"choice", "regex", "grammar"})
_NAME_PARENTS = frozenset({"function", "function_call", "tool_choice", "json_schema"})
_NAME_LISTS = frozenset({"tools", "functions"})
_PROPERTY_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})


def scanned(values: dict[str, Any]) -> dict[str, Any]:
    """The part of a parsed body that is scanned: every top-level member but
    :data:`NOT_SCANNED`, in the body's order."""
    return {k: v for k, v in values.items() if k not in NOT_SCANNED}


def is_structural(value: Any, loc: tuple[int, ...]) -> bool:
    """Whether the string at ``loc`` (a finding's location in ``value``) is structural: a
    ``mask`` there would corrupt the request (see the module docstring).

    Args:
        value: the scanned value (:func:`scanned`).
        loc: one index per level: a list item, or a member in its object's order
            (:attr:`policy.pii.Finding.loc`).
    """
    names: list[str | int] = []
    holder: dict[str, Any] | None = None  # the object holding the string
    node = value
    for i in loc:
        if isinstance(node, dict):
            holder = node
            key, node = next(itertools.islice(node.items(), i, None))
            names.append(key)
        elif isinstance(node, list):
            holder = None
            node = node[i]
            names.append(i)
        else:
            return False
    if not names:
        return False
    last = names[-1]
    if isinstance(last, int):  # an item of a list: the list's name decides
        keyword = _keyword_of(names[:-1])
        return keyword is not None and keyword in (_SCHEMA_WORDS | _GUIDED | _STRUCTURED)
    if last in _VOCABULARY or last in _REFERENCES or (len(names) == 1 and last in _GUIDED):
        return True
    parent = names[-2] if len(names) > 1 else None
    if last == "name" and (
            (holder is not None and "type" in holder) or parent in _NAME_PARENTS
            or (len(names) > 2 and isinstance(parent, int) and names[-3] in _NAME_LISTS)):
        return True
    if parent == "structured_outputs" and last in _STRUCTURED:
        return True
    return any(_schema_word(names, j) for j in range(len(names)))


def _keyword_of(names: list[str | int]) -> str | None:
    """The name of the list at the end of ``names`` when it is a keyword (not a property's
    name), else ``None``."""
    if not names or isinstance(names[-1], int):
        return None
    name = names[-1]
    if len(names) == 1:
        return name if name in _GUIDED else None
    parent = names[-2]
    if parent in _PROPERTY_MAPS:
        return None
    if parent == "structured_outputs" and name in _STRUCTURED:
        return name
    return name if name in _SCHEMA_WORDS else None


def _schema_word(names: list[str | int], j: int) -> bool:
    """Whether ``names[j]`` is a JSON-schema keyword of :data:`_SCHEMA_WORDS` (the strings
    below it are structure)."""
    name = names[j]
    if not isinstance(name, str) or name not in _SCHEMA_WORDS:
        return False
    return j == 0 or names[j - 1] not in _PROPERTY_MAPS


def check_unique_keys(raw: bytes) -> None:
    """Refuse a body with a duplicated object key at any depth.

    The scan reads the parsed body, where a duplicated key keeps its last value, but the
    replica receives the bytes: an earlier duplicate would go upstream unscanned. RFC 8259 §4
    leaves duplicates' meaning open, so refusing them is allowed.

    Raises:
        InvalidRequest: 400 ``duplicate_key`` (the key is not named: it may be sensitive).
    """
    try:
        json.loads(raw, object_pairs_hook=_unique)
    except _Duplicate as exc:
        raise InvalidRequest(
            "The request body repeats an object key; with a sensitive-data policy every key "
            "must be unique (the scan and the model would read different values).",
            code="duplicate_key") from exc


class _Duplicate(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Duplicate
    return obj
