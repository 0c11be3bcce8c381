"""The upstream chunked decoder (gateway.h1.framing.ChunkedDecoder) fed every split of a wire.

The decoder has a one-match path for the usual size line (hex digits, CRLF) and a general
path (extensions, partial lines); whichever way the bytes arrive, the decoded body and the
refusals must be the same.
"""

from __future__ import annotations

import random

import pytest

from gateway.h1.framing import ChunkedDecoder, ProtocolError

EVENTS = [b'data: {"i":%d}\n\n' % i for i in range(40)]


def _wire(extensions: bool) -> bytes:
    out = b""
    for i, event in enumerate(EVENTS):
        ext = b";name=%d" % i if extensions and i % 3 == 0 else b""
        out += b"%x%s\r\n%s\r\n" % (len(event), ext, event)
    return out + b"0\r\n\r\n"


def _decode(wire: bytes, cuts: list[int]) -> tuple[bytes, bool]:
    decoder, last = ChunkedDecoder(), 0
    out: list[bytes] = []
    for cut in [*cuts, len(wire)]:
        decoder.feed(wire[last:cut], out)
        last = cut
    return b"".join(out), decoder.done


@pytest.mark.parametrize("extensions", [False, True])
def test_every_split_decodes_the_same_body(extensions: bool) -> None:
    wire = _wire(extensions)
    body = b"".join(EVENTS)
    rng = random.Random(7)  # noqa: S311 - reproducible splits, not secrets
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(wire)), rng.randint(1, 40)))
        assert _decode(wire, cuts) == (body, True)
    for cut in range(1, len(wire)):  # and every single cut
        assert _decode(wire, [cut]) == (body, True)


@pytest.mark.parametrize("parts", [
    [b"5\r\nabcdeXX"],                  # no CRLF after the data, on the one-match path
    [b"5\r\nab", b"cdeXX"],             # the same, the data split
    [b"0x5\r\nabcde\r\n"],              # int(..., 16) would take it
    [b"10000000000000000\r\n"],         # 17 hex digits
], ids=["no-crlf", "no-crlf-split", "0x", "too-many-digits"])
def test_bad_framing_is_refused_on_either_path(parts: list[bytes]) -> None:
    decoder = ChunkedDecoder()
    out: list[bytes] = []
    with pytest.raises(ProtocolError):
        for part in parts:
            decoder.feed(part, out)
