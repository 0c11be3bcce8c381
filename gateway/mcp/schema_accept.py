"""A quick acceptance test for the common shape of a tool's ``inputSchema``, ahead of
``jsonschema``.

Most tools declare a flat object (``type``, ``properties``, ``required``,
``additionalProperties``, titles and descriptions). For such a schema :func:`acceptor` builds a
test that answers "certainly valid" in a few type checks, where ``jsonschema``'s full
validation walks its keyword functions, type checker and path bookkeeping for each call (about
a tenth of the gateway's CPU per tool call, cProfile of ``bench/mcp.py``).

The test only ever *accepts*: ``False`` means "not known", and the caller then validates with
``jsonschema`` as before (:func:`gateway.mcp.arguments.check_schema`), which gives the verdict
and the message. So it can only skip work, never let through what ``jsonschema`` refuses, as
long as it is no looser than ``jsonschema`` on what it accepts; it is kept stricter:

* a schema using any keyword outside :data:`_KEYWORDS` (``$ref``, ``enum``, ``pattern``,
  ``format``, ``items``, combinators, ...) gets no test at all;
* types are checked by exact Python type (``integer``: ``int`` only, not ``1.0`` nor ``True``;
  ``number``: ``int`` or ``float``, not ``bool``), the types ``json.loads`` produces;
* only validator classes with the draft 6 - 2020-12 type semantics are served (the type
  checker of ``Draft202012Validator``).

``tests/gateway/mcp_gateway/test_mcp_schema_accept.py`` checks "accepted implies valid"
against ``jsonschema`` itself on generated schemas and instances.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jsonschema

__all__ = ["Acceptor", "acceptor"]

Acceptor = Callable[[Any], bool]
"""``accept(instance) -> bool``: ``True``: valid against the schema; ``False``: not known."""

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment",
                          "deprecated", "readOnly", "writeOnly"})
_KEYWORDS = _ANNOTATIONS | {"type", "properties", "required", "additionalProperties"}
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,), "array": (list,), "string": (str,), "integer": (int,),
    "number": (int, float), "boolean": (bool,), "null": (type(None),),
}


def _any(_instance: Any) -> bool:
    return True


def acceptor(schema: Any, validator_cls: type) -> Acceptor | None:
    """The quick acceptance test of ``schema`` (validated by ``validator_cls``), or ``None``
    when the schema uses anything beyond the supported subset (see the module docstring).

    Args:
        schema: The tool's ``inputSchema`` (already checked as a schema by the caller).
        validator_cls: The ``jsonschema`` validator class that validates it.
    """
    if getattr(validator_cls, "TYPE_CHECKER", None) is not (
            jsonschema.Draft202012Validator.TYPE_CHECKER):
        return None
    if isinstance(schema, Mapping):
        schema = {k: v for k, v in schema.items() if k != "$schema"}  # names the class only
    return _compile(schema)


def _compile(schema: Any) -> Acceptor | None:
    if schema is True or schema == {}:
        return _any
    if not isinstance(schema, Mapping) or not set(schema) <= _KEYWORDS:
        return None
    types = _types(schema.get("type"))
    if types is None:
        return None
    properties: dict[str, Acceptor] = {}
    raw_properties = schema.get("properties", {})
    if not isinstance(raw_properties, Mapping):
        return None
    for name, sub in raw_properties.items():
        test = _compile(sub)
        if test is None:
            return None
        properties[str(name)] = test
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return None
    extra = schema.get("additionalProperties", True)
    if extra is False:
        others: Acceptor | None = None
    else:
        others = _compile(extra)
        if others is None:
            return None
    return _object_test(types, properties, tuple(required), others)


def _types(value: Any) -> tuple[type, ...] | None:
    """The Python types ``type`` allows (``()``: any), ``None`` if not understood."""
    if value is None:
        return ()
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(n in _TYPES for n in names):
        return None
    return tuple(t for n in names for t in _TYPES[n])


def _object_test(types: tuple[type, ...], properties: dict[str, Acceptor],
                 required: tuple[str, ...], others: Acceptor | None) -> Acceptor:
    # The object keywords apply to objects only; other instances pass them (JSON Schema).
    trivial = not properties and not required and others is _any

    def accept(instance: Any) -> bool:
        kind = type(instance)
        if types and kind not in types:
            return False
        if kind is not dict:  # a dict subclass is an object too: not known, unless trivial
            return trivial or not isinstance(instance, dict)
        for name in required:
            if name not in instance:
                return False
        for name, value in instance.items():
            test = properties.get(name, others)
            if test is None or not test(value):
                return False
        return True

    return accept
