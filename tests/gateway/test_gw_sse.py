"""The incremental SSE usage scanner: framing variants, split chunks, usage-event removal."""

from __future__ import annotations

import json

import pytest

from gateway.relay.rewrite import SSEUsageScanner, Usage, usage_from_body

CHUNK = {"id": "c1", "object": "chat.completion.chunk", "choices": [{"index": 0,
         "delta": {"content": "naïve 日本語 🚀"}}]}
USAGE = {"id": "c1", "object": "chat.completion.chunk", "choices": [],
         "usage": {"prompt_tokens": 7, "completion_tokens": 11, "total_tokens": 18}}


def stream(eol: bytes = b"\n", space: bool = True, usage: bool = True) -> bytes:
    sep = b"data: " if space else b"data:"
    events = [CHUNK, CHUNK] + ([USAGE] if usage else [])
    body = b"".join(sep + json.dumps(e, ensure_ascii=False).encode() + eol + eol for e in events)
    return body + sep + b"[DONE]" + eol + eol


def run(scanner: SSEUsageScanner, chunks: list[bytes]) -> bytes:
    out = b"".join(scanner.feed(c) for c in chunks)
    return out + scanner.finish()


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
@pytest.mark.parametrize("space", [True, False])
def test_usage_found_and_bytes_unchanged(eol: bytes, space: bool) -> None:
    raw = stream(eol, space)
    scanner = SSEUsageScanner()
    assert run(scanner, [raw]) == raw
    assert scanner.usage == Usage(7, 11)
    assert scanner.done


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"])
def test_split_at_every_byte_position(eol: bytes) -> None:
    """Events and multi-byte UTF-8 characters split across network chunks."""
    raw = stream(eol)
    for cut in range(1, len(raw)):
        keep = SSEUsageScanner()
        assert run(keep, [raw[:cut], raw[cut:]]) == raw
        assert keep.usage == Usage(7, 11), cut
        drop = SSEUsageScanner(drop_usage_only=True)
        assert run(drop, [raw[:cut], raw[cut:]]) == stream(eol, usage=False), cut
        assert drop.usage == Usage(7, 11), cut


def test_one_byte_chunks() -> None:
    raw = stream(b"\r\n")
    scanner = SSEUsageScanner(drop_usage_only=True)
    out = run(scanner, [raw[i : i + 1] for i in range(len(raw))])
    assert out == stream(b"\r\n", usage=False)
    assert scanner.usage == Usage(7, 11)
    out.decode("utf-8")  # never cut inside a character when reassembled


def test_drop_removes_only_the_usage_only_event() -> None:
    scanner = SSEUsageScanner(drop_usage_only=True)
    out = run(scanner, [stream()])
    assert b'"usage"' not in out
    assert out.count(b"data: ") == 3  # two chunks + [DONE]


def test_continuous_usage_on_content_events_is_not_dropped() -> None:
    event = dict(CHUNK, usage={"prompt_tokens": 1, "completion_tokens": 2})
    raw = b"data: " + json.dumps(event).encode() + b"\n\n"
    scanner = SSEUsageScanner(drop_usage_only=True)
    assert run(scanner, [raw]) == raw
    assert scanner.usage == Usage(1, 2)


def test_at_boundary_tracks_half_sent_events() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(b'data: {"a": 1}\n\ndata: {"b"')
    assert not scanner.at_boundary
    scanner.feed(b": 2}\n\n")
    assert scanner.at_boundary


def test_no_usage_without_usage_event() -> None:
    scanner = SSEUsageScanner()
    run(scanner, [stream(usage=False)])
    assert scanner.usage is None
    assert scanner.done


def test_multiline_data_event() -> None:
    raw = b'data: {"choices": [],\ndata: "usage": {"prompt_tokens": 3, "completion_tokens": 4}}\n\n'
    scanner = SSEUsageScanner(drop_usage_only=True)
    assert run(scanner, [raw]) == b""
    assert scanner.usage == Usage(3, 4)


def test_usage_from_body_variants() -> None:
    body = b'{"usage": {"prompt_tokens": 5, "completion_tokens": 6}}'
    assert usage_from_body(body) == Usage(5, 6)
    assert usage_from_body(b'{"usage": {"prompt_tokens": 5, "total_tokens": 5}}') == Usage(5, 0)
    assert usage_from_body(b'{"usage": {"input_tokens": 2, "output_tokens": 9}}') == Usage(2, 9)
    assert usage_from_body(b'{"choices": []}') is None
    assert usage_from_body(b'{"usage": ') is None


@pytest.mark.parametrize("drop", [False, True])
def test_done_in_generated_text_is_no_end_of_stream(drop: bool) -> None:
    """Only the ``data: [DONE]`` line ends a stream: an event whose text says ``[DONE]`` (a
    client disconnect after it) is counted as a token, not taken for the end."""
    events = [b'data: {"choices":[{"index":0,"delta":{"content":"say [DONE]"}}]}\n\n',
              b'data: {"choices":[{"index":0,"delta":{"content":"data: [DONE]"}}]}\n\n']
    scanner = SSEUsageScanner(drop_usage_only=drop)
    for event in events:
        scanner.feed(event)
    assert not scanner.done and scanner.estimated_output_tokens == 2
    scanner.feed(b"data: [DONE]\n\n")
    assert scanner.done and scanner.estimated_output_tokens == 2
