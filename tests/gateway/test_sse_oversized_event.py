"""The SSE usage scanner against a replica that never ends its event.

The scanner holds the incomplete event at the end of what it saw (to find usage in it once
complete, or to hold a usage-only event back). A replica that streams megabytes without a blank
line made it hold all of them and copy and rescan them on every network chunk: 50 MB cost 90 s
of CPU in the event loop, which serves every other request of the process (and in drop mode
the client got none of it). An event longer than :data:`gateway.relay.rewrite.MAX_EVENT_BYTES` is no
usage event: it is passed on and no longer held.
"""

from __future__ import annotations

import json
import time

import pytest

from gateway.relay.rewrite import MAX_EVENT_BYTES, SSEUsageScanner, Usage

PIECE = 64 * 1024
USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}\n\n'
CONTENT = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'


def _endless(size: int) -> list[bytes]:
    """One event ``size`` bytes long without its end, in 64 KiB network chunks."""
    body = b"data: " + b"x" * (size - 6)
    return [body[i:i + PIECE] for i in range(0, size, PIECE)]


@pytest.mark.parametrize("drop", [False, True], ids=["relay", "drop-usage"])
def test_an_event_without_end_costs_linear_time_and_bounded_memory(drop: bool) -> None:
    size = 4 * MAX_EVENT_BYTES
    scanner = SSEUsageScanner(drop_usage_only=drop)
    out = bytearray()
    start = time.process_time()
    for chunk in _endless(size):
        out += scanner.feed(chunk)
        assert scanner.held_bytes <= MAX_EVENT_BYTES + PIECE
    spent = time.process_time() - start
    assert spent < 1.0, f"{spent:.1f} s of CPU for {size} bytes"
    assert len(out) == size  # every byte passed on (drop mode: once past the limit)
    assert not scanner.at_boundary
    # The stream goes on with ordinary events: counted, and usage found (and dropped).
    out += scanner.feed(b"\n\n" + CONTENT + USAGE + b"data: [DONE]\n\n")
    out += scanner.finish()
    assert scanner.usage == Usage(3, 4) and scanner.done and scanner.at_boundary
    tail = out[size:]
    assert tail.startswith(b"\n\n" + CONTENT)
    assert (USAGE in tail) is not drop


@pytest.mark.parametrize("cut", [1, 2, 3, PIECE - 1])
def test_the_end_of_an_oversized_event_is_found_wherever_the_chunks_split_it(cut: int) -> None:
    chunks = _endless(MAX_EVENT_BYTES + PIECE)
    rest = b"\r\n\r\n" + USAGE
    scanner = SSEUsageScanner(drop_usage_only=True)
    out = b"".join(scanner.feed(c) for c in [*chunks, rest[:cut], rest[cut:]])
    out += scanner.finish()
    assert out == b"".join(chunks) + b"\r\n\r\n"
    assert scanner.usage == Usage(3, 4)


def test_a_large_event_below_the_limit_is_still_held_and_read_whole() -> None:
    """A Responses API ``response.completed`` event carries the whole output and the usage."""
    text = "y" * (MAX_EVENT_BYTES // 2)
    event = b"data: " + json.dumps({"type": "response.completed", "response": {
        "output_text": text, "usage": {"input_tokens": 5, "output_tokens": 6}}}).encode()
    chunks = [event[i:i + PIECE] for i in range(0, len(event), PIECE)] + [b"\n\n"]
    scanner = SSEUsageScanner()
    assert b"".join(scanner.feed(c) for c in chunks) + scanner.finish() == event + b"\n\n"
    assert scanner.usage == Usage(5, 6)
