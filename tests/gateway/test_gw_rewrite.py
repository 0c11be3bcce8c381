"""Request body rewrite: only ``model`` and ``stream_options`` change, byte for byte."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.relay import rewrite
from gateway.relay.rewrite import parse_body


def test_only_model_changes_byte_for_byte() -> None:
    raw = (
        '{ "model" : "default",\n  "messages": [{"role": "user", "content": "é \\u00e9"}],'
        '"temperature": 1.0e0, "response_format": {"type": "json_schema", "json_schema": '
        '{"name": "x", "schema": {"properties": {"model": {"type": "string"}}}}},'
        '"guided_json": {"a": 1}, "logprobs": true, "top_k": 5 }'
    ).encode()
    parsed = parse_body(raw)
    assert parsed.model == "default"
    out = parsed.upstream_body("meta/Llama", force_usage=True)
    assert out == raw.replace(b'"default"', b'"meta/Llama"')


def test_stream_usage_forced_when_missing() -> None:
    raw = b'{"model":"m","stream":true,"messages":[]}'
    parsed = parse_body(raw)
    assert parsed.stream and not parsed.client_wants_usage
    out = parsed.upstream_body("s", force_usage=True)
    assert json.loads(out) == {"model": "s", "stream": True, "messages": [],
                               "stream_options": {"include_usage": True}}
    assert out.endswith(b'"model":"s","stream":true,"messages":[]}')


def test_stream_usage_merged_into_existing_options() -> None:
    raw = b'{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":false}}'
    out = json.loads(parse_body(raw).upstream_body("s", force_usage=True))
    assert out["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}


def test_client_usage_request_kept() -> None:
    raw = b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}'
    parsed = parse_body(raw)
    assert parsed.client_wants_usage
    assert parsed.upstream_body("m", force_usage=True) == raw


def test_non_stream_untouched_except_model() -> None:
    raw = b'{"model":"m","input":["a"]}'
    assert parse_body(raw).upstream_body("x", force_usage=True) == b'{"model":"x","input":["a"]}'


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b'{"model": "m",, }', "line 1 column 15 (char 14)"),
        (b'{"model": "m"\n "x": 1}', "line 2 column 2 (char 15)"),
        (b"[1, 2]", "Expecting a JSON object"),
        (b'{"model": "m"} extra', "Extra data"),
        (b"", "line 1 column 1 (char 0)"),
    ],
)
def test_malformed_json_reports_position(raw: bytes, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_body(raw)
    assert info.value.code == "invalid_json"
    assert fragment in info.value.message


def test_duplicate_model_key_refused() -> None:
    """The gateway and the backend must never read different model names."""
    with pytest.raises(InvalidRequest, match="duplicate key 'model'"):
        parse_body(b'{"model": "allowed", "model": "forbidden"}')


@pytest.mark.parametrize("raw", [b'{"messages": []}', b'{"model": 3}', b'{"model": ""}'])
def test_model_required(raw: bytes) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_body(raw)
    assert info.value.param == "model"


def test_invalid_utf8() -> None:
    with pytest.raises(InvalidRequest, match="UTF-8"):
        parse_body(b'{"model": "\xff"}')


def test_a_body_needing_no_splice_goes_upstream_as_received() -> None:
    raw = '{"model": "m", "messages": [{"role": "user", "content": "h\\u00e9 \u00e9"}]}'.encode()
    parsed = parse_body(raw)
    assert parsed.upstream_body("m", force_usage=True) is raw  # not a copy, not re-encoded
    # The same model spelled with an escape is still written the served way (as before).
    escaped = parse_body(b'{"model":"\\u006d","x":1}')
    assert escaped.upstream_body("m", force_usage=False) == b'{"model":"m","x":1}'
    streamed = parse_body(b'{"model":"m","stream":true}')
    assert streamed.upstream_body("m", force_usage=True) == \
        b'{"stream_options":{"include_usage":true},"model":"m","stream":true}'


_WS = st.text(alphabet=" \t\r\n", max_size=3)
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=8),
                     st.floats(allow_nan=False, allow_infinity=False))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["messages", "max_tokens", "temperature", "x", "n"]),
                       _VALUES, max_size=4),
       st.text(min_size=1, max_size=6), st.lists(_WS, min_size=40, max_size=40))
def test_any_whitespace_between_tokens_reads_like_json_loads(
        others: dict[str, object], model: str, spaces: list[str]) -> None:
    # The top-level walk skips whitespace only where there is some: whatever whitespace a
    # client puts around the delimiters, the values are json.loads's and the model's span
    # holds exactly its value.
    items = [("model", model), *others.items()]
    gaps = iter(spaces)
    text = next(gaps) + "{" + next(gaps)
    text += ",".join(f"{next(gaps)}{json.dumps(k)}{next(gaps)}:{next(gaps)}{json.dumps(v)}"
                     f"{next(gaps)}" for k, v in items)
    text += "}" + next(gaps)
    raw = text.encode()
    parsed = parse_body(raw)
    assert parsed.values == json.loads(text)
    start, end = parsed.spans["model"]
    assert json.loads(raw[start:end]) == model
    assert parsed.open_brace == raw.index(b"{")


# --- The usual body is read whole by the C decoder; the walk only where it must. ------------


def test_a_usual_body_is_read_without_the_key_by_key_walk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A small chat request and its upstream body: one call of the C decoder, no walk (the walk
    # cost ~4 us of the 7 us a small body took to read; a body needing a splice still walks).
    raw = json.dumps({"model": "m", "stream": True, "max_tokens": 5,
                      "messages": [{"role": "user", "content": "h\u00e9 \\n"}]}).encode()

    def no_walk(text: str) -> object:
        raise AssertionError("walked")

    monkeypatch.setattr(rewrite, "_scan_object", no_walk)
    parsed = parse_body(raw)
    assert parsed.values == json.loads(raw)
    assert parsed.upstream_body("m", force_usage=False) is raw
    assert parsed.upstream_body("m", force_usage=True) == \
        b'{"stream_options":{"include_usage":true},' + raw[1:]
    with pytest.raises(AssertionError, match="walked"):
        parsed.upstream_body("other", force_usage=False)  # a splice locates the spans


_KEYS = st.sampled_from(["model", "stream", "stream_options", "messages", "x",
                         "mod\\u0065l", "stre\\u0061m", "\\u006dodel", "priority", "\\u4f60"])
_LITERALS = st.one_of(
    _VALUES.map(lambda v: json.dumps(v, ensure_ascii=False)),
    st.sampled_from(['"m"', '"model"', '"say \\"model"', '"\\u006d"', '"\\u4f60\\u597d"',
                     "true", "1", "null", "1e999", "NaN", '{"include_usage":true}',
                     '{"include_usage":"x"}', '[{"model":"m"}]', '"\\ud800"', "[[[]]]"]))


def _both_ways(raw: bytes, served: str, force: bool) -> tuple[object, ...]:
    try:
        parsed = parse_body(raw)
    except InvalidRequest as exc:
        return ("refused", str(exc), exc.param)
    return (parsed.values, parsed.model, parsed.stream, parsed.client_wants_usage,
            parsed.open_brace, parsed.spans, parsed.upstream_body(served, force))


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_KEYS, _LITERALS), max_size=5), st.sampled_from(["m", "s", "é"]),
       st.booleans(), st.sampled_from(["", " ", "\n "]))
def test_the_whole_read_and_the_walk_read_every_body_alike(
        items: list[tuple[str, str]], served: str, force: bool, gap: str) -> None:
    # Duplicated and escaped interpreted keys, "model" inside values, refused values: every
    # body reads (values, spans, refusal, upstream bytes) exactly as the walk reads it.
    raw = (gap + "{" + ",".join(f'{gap}"{k}"{gap}:{gap}{v}' for k, v in items)
           + "}" + gap).encode()
    fast = _both_ways(raw, served, force)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rewrite, "_read_whole", lambda text: None)  # the walk, always
        assert fast == _both_ways(raw, served, force)


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from([b"data:", b" ", b"[DONE]", b"\n", b"\r", b"x", b"d",
                                 b"ata: [DONE]", b"data: [DONE]"]), max_size=10),
       st.integers(0, 80))
def test_the_end_line_is_found_as_the_regex_finds_it(parts: list[bytes], end: int) -> None:
    region = b"".join(parts)
    end = min(end, len(region))
    assert rewrite._ends(region, end) == (
        rewrite._DONE_LINE.search(region, 0, end) is not None)


def test_the_end_line_is_found_without_the_regex(monkeypatch: pytest.MonkeyPatch) -> None:
    # The regex's leading alternative gave its engine no literal to skip to: it tried every
    # byte of a short stream's answer (27 us of a new stream's ~400 us in a burst).
    class NoRegex:
        def search(self, *args: object) -> object:
            raise AssertionError("regex")

    monkeypatch.setattr(rewrite, "_DONE_LINE", NoRegex())
    events = b'data: {"choices":[{"delta":{"content":"a [DONE]"}}]}\n\n' * 3
    assert rewrite._ends(events + b"data: [DONE]\n\n", len(events) + 14)
    assert not rewrite._ends(events, len(events))
    assert rewrite._ends(b"data:[DONE]", 11)
    assert not rewrite._ends(b"xdata: [DONE]", 13)
