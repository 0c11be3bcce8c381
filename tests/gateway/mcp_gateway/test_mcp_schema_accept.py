"""The quick acceptance test of tool schemas never accepts what ``jsonschema`` refuses.

``jsonschema`` itself is the oracle: generated schemas (the supported subset, and beyond it)
and generated JSON instances; whenever the quick test accepts, ``jsonschema`` must find the
instance valid. The FastMCP shape of a tool schema must take the quick path (else it saves
nothing), and schemas beyond the subset must get no quick test.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.mcp.arguments import check_schema, compile_schema
from gateway.mcp.jsonrpc import McpRefusal
from gateway.mcp.schema_accept import acceptor

NAMES = st.sampled_from(["a", "b", "text", "n"])
TYPE_NAMES = st.sampled_from(["object", "array", "string", "integer", "number", "boolean",
                              "null"])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2, allow_nan=False)
    | st.sampled_from([0.0, 1.0, -1.0]) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=4),
    max_leaves=8,
)


TYPES = TYPE_NAMES | st.lists(TYPE_NAMES, min_size=1, max_size=3, unique=True)


def _subset(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries({}, optional={
        "type": TYPES,
        "properties": st.dictionaries(NAMES, inner, max_size=3),
        "required": st.lists(NAMES, max_size=2, unique=True),
        "additionalProperties": inner | st.just(False),
        "title": st.just("T"),
    })


# The supported subset (where a quick test exists, so where it could be wrong) ...
subset_schemas = st.recursive(
    st.just({}) | st.just(True) | st.fixed_dictionaries({"type": TYPES}), _subset, max_leaves=6)
# ... and schemas with keywords beyond it, anywhere (the quick test must step aside).
beyond_schemas = st.recursive(
    st.just({}) | st.booleans(),
    lambda inner: _subset(inner).flatmap(lambda schema: st.sampled_from([
        {**schema, "enum": [1, "a"]}, {**schema, "minLength": 1}, {**schema, "items": False},
        {**schema, "maximum": 0}, schema])),
    max_leaves=6)


def _accepted_implies_valid(schema: Any, instance: Any) -> None:
    if isinstance(schema, dict):
        jsonschema.Draft202012Validator.check_schema(schema)
    accept = acceptor(schema, jsonschema.Draft202012Validator)
    if accept is not None and accept(instance):
        assert jsonschema.Draft202012Validator(schema).is_valid(instance)


# The fast lane draws 300 pairs (about 2 s); make test also draws the full 1,000 (about 8 s).
test_accepted_implies_valid = settings(max_examples=300, deadline=None)(
    given(subset_schemas | beyond_schemas, json_values)(_accepted_implies_valid))
test_accepted_implies_valid_1000 = pytest.mark.slow(settings(max_examples=1000, deadline=None)(
    given(subset_schemas | beyond_schemas, json_values)(_accepted_implies_valid)))


@settings(max_examples=300, deadline=None)
@given(subset_schemas)
def test_the_subset_gets_a_quick_test(schema: Any) -> None:
    assert acceptor(schema, jsonschema.Draft202012Validator) is not None


FASTMCP_ECHO = {"properties": {"text": {"title": "Text", "type": "string"}},
                "required": ["text"], "title": "echoArguments", "type": "object"}


def test_fastmcp_shape_takes_the_quick_path() -> None:
    accept = compile_schema(FASTMCP_ECHO).accept
    assert accept is not None
    assert accept({"text": "hi"}) and accept({"text": "hi", "other": 1})
    assert not accept({"text": 1}) and not accept({}) and not accept([]) and not accept(None)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"x": {"$ref": "#/$defs/X"}}, "$defs": {"X": {}}},
    {"type": "object", "properties": {"x": {"type": "string", "pattern": "^a"}}},
    {"anyOf": [{"type": "string"}, {"type": "null"}]},
    {"type": "string", "format": "uri"},
])
def test_schemas_beyond_the_subset_get_no_quick_test(schema: dict[str, Any]) -> None:
    assert compile_schema(schema).accept is None


def test_older_type_semantics_get_no_quick_test() -> None:
    # Draft 4 counts 1.0 as a number but not an integer: other type rules, no quick test.
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}
    assert compile_schema(schema).accept is None


def test_refusal_still_comes_from_jsonschema() -> None:
    with pytest.raises(McpRefusal) as info:
        check_schema({"text": 5}, FASTMCP_ECHO, compile_schema(FASTMCP_ECHO))
    assert info.value.reason == "schema_invalid"
    assert "at text: type 'string'" in info.value.message


def test_dict_subclass_is_not_taken_for_valid() -> None:
    class Odd(dict[str, Any]):
        pass

    accept = compile_schema(FASTMCP_ECHO).accept
    assert accept is not None
    assert not accept(Odd(text=1)) and not accept(Odd(text="x"))
