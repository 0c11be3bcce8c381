"""The strict reader's prefilter (:func:`gateway.relay.strict_json.tree_check_needed`): the
walk over a parsed value is skipped only for texts in which it cannot find anything, so every
lone surrogate and every nesting past the limit is still refused (no I/O)."""

from __future__ import annotations

import json
import random

import pytest

from gateway.mcp import jsonrpc
from gateway.mcp.jsonrpc import McpRefusal, parse_message
from gateway.relay import strict_json
from gateway.relay.rewrite import MAX_DEPTH
from gateway.relay.strict_json import (
    StrictJsonError,
    check_tree,
    loads_strict,
    tree_check_needed,
)


def _walk_refuses(text: str) -> bool:
    try:
        check_tree(json.loads(text))
    except StrictJsonError:
        return True
    return False


@pytest.mark.parametrize("where", ["value", "key"])
def test_every_surrogate_escape_spelling_is_walked(where: str) -> None:
    """Each escape from U+D700 to U+E0FF in lower, upper and mixed case, as a value and as a
    key: where the walk refuses, the prefilter asked for it, and the reader refuses."""
    for cp in range(0xD700, 0xE100):
        low = f"{cp:04x}"
        for spelled in (low, low.upper(), low[:2].upper() + low[2:], low[:2] + low[2:].upper()):
            text = ('{"a":"x\\u' + spelled + '"}' if where == "value"
                    else '{"x\\u' + spelled + '":1}')
            refused = _walk_refuses(text)
            assert refused == (0xD800 <= cp <= 0xDFFF), text
            if refused:
                assert tree_check_needed(text), text
                with pytest.raises(StrictJsonError, match="surrogate"):
                    loads_strict(text.encode())


def test_nesting_at_and_past_the_limit() -> None:
    """Mixed ``[``/``{`` nesting at every depth up to twice the limit: refused exactly past
    :data:`MAX_DEPTH`, never let through by the prefilter."""
    rng = random.Random(128)  # noqa: S311  (test data)
    for depth in range(1, 2 * MAX_DEPTH + 2):
        opens = [rng.choice("[{") for _ in range(depth)]
        text = "".join("[" if o == "[" else '{"k":' for o in opens) + "1"
        text += "".join("]" if o == "[" else "}" for o in reversed(opens))
        assert _walk_refuses(text) == (depth > MAX_DEPTH)
        if depth > MAX_DEPTH:
            assert tree_check_needed(text)
            with pytest.raises(StrictJsonError, match=f"deeper than {MAX_DEPTH}"):
                loads_strict(text.encode())
        else:
            loads_strict(text.encode())


def test_false_alarms_still_parse() -> None:
    """Texts the prefilter cannot clear (a valid pair, an escaped backslash before ``ud800``,
    brackets inside strings) are walked and accepted."""
    for text in ('{"pair":"\\ud83d\\ude00"}', '{"escaped":"\\\\ud800"}',
                 '{"s":"' + "[" * (MAX_DEPTH + 5) + '"}'):
        assert tree_check_needed(text)
        assert isinstance(loads_strict(text.encode()), dict)


def test_text_given_decoded_is_checked_for_surrogate_characters() -> None:
    """``loads_strict`` also takes text: a surrogate character in it (no escape) is found."""
    assert tree_check_needed('"\ud800"')
    with pytest.raises(StrictJsonError, match="surrogate"):
        loads_strict('["ok", "\udc00"]')
    assert not tree_check_needed('{"text":"é 🙂"}')


def test_plain_mcp_message_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message without brackets past the limit or a surrogate escape skips the Python walk
    (the CPU a tool call spends in the gateway); one with an escape is walked and refused."""
    def walked(_: object) -> None:
        raise AssertionError("walked")

    monkeypatch.setattr(strict_json, "check_tree", walked)
    monkeypatch.setattr(jsonrpc, "check_tree", walked, raising=False)  # a copy imported there
    msg = parse_message(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'
                        b'"echo","arguments":{"text":"hi \\u00e9"}}}')
    assert msg.name == "echo"
    monkeypatch.undo()
    with pytest.raises(McpRefusal) as exc:
        parse_message(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":'
                      b'"echo","arguments":{"text":"\\udfff"}}}')
    assert exc.value.reason == "parse_error" and "surrogate" in exc.value.message
