"""The server's request reader against h11 as the oracle, on generated requests.

In the spirit of h11's own tests against the standard library: Hypothesis generates request
heads (valid and broken methods, targets, header lines), bodies (``Content-Length`` or chunked
with random chunk sizes and extensions), split points and pipelined requests; the gateway's
:class:`gateway.h1.framing.RequestReader` and ``h11.Connection`` must agree on whether the
bytes are refused and, when not, on every request (method, target, headers, body).

Where the gateway is deliberately stricter the case is not compared but checked on its own
(each difference named below):

* ambiguous or unsupported framing (``Content-Length`` with ``Transfer-Encoding``, repeated
  ``Content-Length``, obs-fold, ``Transfer-Encoding`` other than ``chunked`` or in HTTP/1.0):
  refused (400 ``invalid_framing``); h11 accepts several of them (request smuggling);
* chunk extensions with control characters (CR, NUL, DEL, ...): refused; h11 accepts them;
* a head with bare LF line ends: refused; h11 accepts them (RFC 9112 §2.2 allows either);
* control characters (other than HTAB) in a header value or the request line: refused (RFC
  9110 §5.5); h11 accepts all but NUL and whitespace;
* empty lines before a request line: ignored (RFC 9112 §2.2); h11 refuses them;
* HTTP versions other than 1.0 and 1.1: refused (505); not generated here;
* whitespace before a chunk extension's ``;`` (``1 ;a=b``): accepted, as RFC 9112 §7.1.1's
  BWS allows; h11 refuses it; not generated here.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

import h11
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.h1.framing import (
    RequestHead,
    RequestReader,
    RequestRefused,
    _parse_request_lines,
    parse_request_head,
)

TOKEN = st.text(alphabet="!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCXYZ",
                min_size=1, max_size=8)
METHOD = st.one_of(st.sampled_from(["GET", "POST", "PUT", "DELETE", "OPTIONS"]), TOKEN,
                   st.sampled_from(["G T", "", "GE\x00T"]))
TARGET = st.one_of(
    st.sampled_from(["/", "/v1/models", "/v1/chat/completions?x=1", "/a%2Fb", "*"]),
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1,
            max_size=12).map(lambda t: "/" + t),
    st.sampled_from(["/a b", "/\x7f", ""]))
VALUE = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12),
    st.sampled_from(["a\x00b", "tab\there", "x\x7fy", " padded ", "\x80\xff"]))
NAME = st.one_of(TOKEN, st.sampled_from(["bad name", "x:y", ""]))
EXTENSION = st.one_of(
    st.just(""), st.sampled_from([";a", ";a=b", ";a=\"q\""]),
    st.sampled_from([";a=\x00", ";a\rb", ";a=\x7f", ";\tb"]))


@st.composite
def requests(draw: Any) -> bytes:
    """One request's bytes: a head, then a Content-Length or chunked body (or none)."""
    method, target = draw(METHOD), draw(TARGET)
    version = draw(st.sampled_from(["1.1", "1.1", "1.0"]))
    headers = draw(st.lists(st.tuples(NAME, VALUE), max_size=4))
    if version == "1.1" and draw(st.booleans() | st.just(True)):
        headers.insert(draw(st.integers(0, len(headers))), ("Host", "gw"))
    body = b""
    framing = draw(st.sampled_from(["none", "length", "chunked"]))
    if framing == "length":
        body = draw(st.binary(max_size=40))
        headers.append(("Content-Length", str(len(body))))
    elif framing == "chunked" and version == "1.1":
        headers.append(("Transfer-Encoding", "chunked"))
        for size in draw(st.lists(st.integers(1, 20), max_size=4)):
            body += b"%x%s\r\n%s\r\n" % (size, draw(EXTENSION).encode("latin-1"), b"d" * size)
        body += b"0\r\n\r\n"
    head = f"{method} {target} HTTP/{version}\r\n" + "".join(
        f"{n}: {v}\r\n" for n, v in headers) + "\r\n"
    return head.encode("latin-1") + body


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def ours(pieces: list[bytes]) -> tuple[list[Any], bool]:
    """The requests the gateway's reader reads, and whether it refused."""
    reader = RequestReader()
    seen: list[Any] = []
    for piece in pieces:
        reader.feed(piece)
        while True:
            try:
                event = reader.next_event()
            except RequestRefused:
                return seen, True
            if isinstance(event, RequestHead):
                seen.append([event.method, event.target, event.version,
                             [(n, v) for n, v in event.headers], b""])
            elif event is not None:
                seen[-1][4] += event
            elif reader.complete:
                assert reader.head is not None
                if not reader.head.keep_alive:
                    return seen, False  # the server closes after its response
                reader.next_request()
            else:
                break
    return seen, False


def theirs(pieces: list[bytes]) -> tuple[list[Any], bool]:
    """What h11 reads (answering each request so that it reads the next)."""
    conn = h11.Connection(h11.SERVER)
    seen: list[Any] = []
    for piece in pieces:
        conn.receive_data(piece)
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:
                return seen, True
            if event is h11.NEED_DATA:
                break
            if event is h11.PAUSED:
                break
            if isinstance(event, h11.Request):
                seen.append([event.method, event.target, event.http_version,
                             [(n, v) for n, v in event.headers.raw_items()], b""])
            elif isinstance(event, h11.Data):
                seen[-1][4] += event.data
            elif isinstance(event, h11.EndOfMessage):
                conn.send(h11.Response(status_code=200, headers=[(b"content-length", b"0")]))
                conn.send(h11.EndOfMessage())
                if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                    conn.start_next_cycle()
                else:
                    return seen, False
    return seen, False


_CONTROL = re.compile(rb"[\x01-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _normalised(seen: list[Any]) -> list[Any]:
    return [[m, t, v, [(n.lower(), val) for n, val in h], b] for m, t, v, h, b in seen]


def _deliberately_stricter(data: bytes) -> bool:
    """A case the gateway refuses on purpose (module docstring) whatever h11 does."""
    reader = RequestReader()
    reader.feed(data)
    try:
        while reader.next_event() is not None or (reader.complete and reader.buffered):
            if reader.complete:
                reader.next_request()
    except RequestRefused as exc:
        if exc.code == "invalid_framing":
            return True
        if "illegal" in exc.reason and _CONTROL.search(data):
            return True
        return "chunk size line" in exc.reason
    return False


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(requests(), min_size=1, max_size=3), st.lists(st.integers(0, 400), max_size=4))
def test_reader_agrees_with_h11(batch: list[bytes], cuts: list[int]) -> None:
    data = b"".join(batch)  # pipelined when more than one
    our_seen, our_refused = ours(_split(data, cuts))
    if our_refused and _deliberately_stricter(data):
        return
    their_seen, their_refused = theirs(_split(data, cuts))
    assert our_refused == their_refused, (data, our_seen, their_seen)
    assert _normalised(our_seen) == _normalised(their_seen), data
    # However the bytes are split, the gateway reads the same.
    assert ours([data]) == (our_seen, our_refused)


@settings(max_examples=100, deadline=None)
@given(requests())
def test_bare_lf_heads_are_refused(data: bytes) -> None:
    head, sep, body = data.partition(b"\r\n\r\n")
    assert sep
    assert ours([head.replace(b"\r\n", b"\n") + b"\n\n" + body])[1] is True


def _parsed(parse: Any, head: bytes) -> Any:
    try:
        return parse(head)
    except RequestRefused as exc:
        return ("refused", exc.status, exc.code, exc.reason)


@settings(max_examples=400, deadline=None)
@given(requests(), st.sampled_from(["", "Content-Length: 7", "Content-length:  007 ",
                                    "Content-Length: 1, 1", "Transfer-Encoding: chunked",
                                    "Connection: close", "Expect: 100-continue", " folded",
                                    "Host: again"]))
def test_plain_head_fast_path_agrees_with_the_line_by_line_parse(data: bytes, extra: str) -> None:
    # parse_request_head reads a plain head in a few regex passes and leaves the rest to the
    # line-by-line parser: the same head or the same refusal, whichever way.
    head = data.partition(b"\r\n\r\n")[0]
    if extra:
        head += b"\r\n" + extra.encode("latin-1")
    assert _parsed(parse_request_head, head) == _parsed(_parse_request_lines, head), head


# --- responses: what the server writes, read by h11 as the client ------------------------------

async def _shaped(scope: Any, receive: Any, send: Any) -> None:
    """Answers as the request's ``x-shape`` header says: sized, streamed, empty, 204."""
    if scope["type"] == "lifespan":
        while (message := await receive())["type"] != "lifespan.shutdown":
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    shape = dict(scope["headers"]).get(b"x-shape", b"sized")
    status = 204 if shape == b"204" else 200
    headers = [(b"content-type", b"text/plain")]
    pieces = [b"hello ", b"", b"world\r\n0\r\n\r\n"]
    if shape == b"sized":
        headers.append((b"content-length", b"%d" % sum(map(len, pieces))))
    elif shape == b"204":
        pieces = []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    for piece in pieces:
        await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def test_responses_read_by_h11_as_sent(tmp_path: Any) -> None:
    from tests.gateway.gateway_server import Servers, connect
    from tests.gateway.helpers import settings as gateway_settings

    servers = Servers()
    srv = servers.start(gateway_settings(["http://127.0.0.1:9"]), _shaped)
    try:
        cases = [(b"GET", b"1.1", b"sized"), (b"GET", b"1.1", b"streamed"),
                 (b"HEAD", b"1.1", b"sized"), (b"HEAD", b"1.1", b"streamed"),
                 (b"GET", b"1.1", b"204"), (b"GET", b"1.0", b"streamed"),
                 (b"GET", b"1.0", b"sized")]
        for method, version, shape in cases:
            client = h11.Connection(h11.CLIENT)
            with connect(srv.port) as sock:
                # h11 sends HTTP/1.1 only: it is told the request, the bytes are written here.
                client.send(h11.Request(method=method, target="/",
                                        headers=[("Host", "gw"), ("x-shape", shape)]))
                client.send(h11.EndOfMessage())
                sock.sendall(b"%s / HTTP/%s\r\nHost: gw\r\nx-shape: %s\r\n\r\n"
                             % (method, version, shape))
                sock.settimeout(5)
                response: Any = None
                body = b""
                raw = b""
                while True:
                    event = client.next_event()
                    if event is h11.NEED_DATA:
                        data = sock.recv(65536)
                        raw += data
                        client.receive_data(data)
                        continue
                    if isinstance(event, h11.Response):
                        response = event
                    elif isinstance(event, h11.Data):
                        body += event.data
                    elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                        break
            case = (method, version, shape)
            names = [n for n, _ in response.headers]
            assert response.status_code == (204 if shape == b"204" else 200), case
            assert names.count(b"content-length") + names.count(b"transfer-encoding") <= 1, (
                case, raw[:300])
            expected = b"" if method == b"HEAD" or shape == b"204" else b"hello world\r\n0\r\n\r\n"
            assert body == expected, case
    finally:
        servers.stop_all()
