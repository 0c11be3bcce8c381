"""Request framing: ambiguous or conflicting framing is refused with 400 and the connection closed.

RFC 9112 §6.1/§6.3 (message body length) and §5.2 (obs-fold). Each case is sent on a raw socket
to a relay path and to a FastAPI path of the gateway served with the production uvicorn options;
a second request hidden behind the first must never be served.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.app import create_app
from gateway.h1.framing import RequestHead, RequestReader, RequestRefused
from tests.conftest import free_port
from tests.gateway.gateway_server import Servers, connect, read_until_closed, split_response
from tests.gateway.helpers import KEY_A, Sim, config, settings

BODY = b'{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'
LIMIT = 16 * 1024  # uvicorn's h11_max_incomplete_event_size: the request head limit, bytes
SMUGGLED = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
CHUNKED = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)


def _head(path: bytes, *headers: bytes, version: bytes = b"HTTP/1.1") -> bytes:
    lines = [b"POST " + path + b" " + version, b"Host: gw",
             b"Authorization: Bearer " + KEY_A.encode(), b"Content-Type: application/json",
             *headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


# name -> (headers, body after the head); every body is followed by SMUGGLED.
CASES: dict[str, tuple[tuple[bytes, ...], bytes]] = {
    "cl_and_te": ((b"Content-Length: %d" % len(CHUNKED), b"Transfer-Encoding: chunked"),
                  CHUNKED),
    "te_and_cl": ((b"Transfer-Encoding: chunked", b"Content-Length: 4"), CHUNKED),
    "te_gzip_chunked": ((b"Transfer-Encoding: gzip, chunked",), CHUNKED),
    "te_chunked_identity": ((b"Transfer-Encoding: chunked, identity",), CHUNKED),
    "te_twice": ((b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked"), CHUNKED),
    "te_xchunked": ((b"Transfer-Encoding: xchunked",), CHUNKED),
    "cl_twice_equal": ((b"Content-Length: %d" % len(BODY),) * 2, BODY),
    "cl_twice_different": ((b"Content-Length: %d" % len(BODY), b"Content-Length: 1"), BODY),
    "cl_list": ((b"Content-Length: %d, %d" % (len(BODY), len(BODY)),), BODY),
    "cl_plus_sign": ((b"Content-Length: +%d" % len(BODY),), BODY),
    "cl_hex": ((b"Content-Length: 0x%x" % len(BODY),), BODY),
    "obs_fold_te": ((b"Transfer-Encoding:", b" chunked"), CHUNKED),
    "obs_fold_cl": ((b"Content-Length:", b"\t%d" % len(BODY)), BODY),
    "obs_fold_other": ((b"Content-Length: %d" % len(BODY), b"X-Note: a", b" b"), BODY),
}


@pytest.fixture
def guarded() -> Iterator[Servers]:
    servers = Servers()
    yield servers
    servers.stop_all()


@pytest.fixture
def gateway(guarded: Servers, sim: Sim) -> Any:
    return guarded.start(settings([sim.url]))


@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/models"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_ambiguous_framing_is_refused_and_connection_closed(
    gateway: Any, sim: Sim, case: str, path: bytes
) -> None:
    headers, body = CASES[case]
    before = sim.stats()["received"]
    with connect(gateway.port) as sock:
        sock.sendall(_head(path, *headers) + body + SMUGGLED)
        data, closed = read_until_closed(sock)
    assert closed, f"{case}: connection left open: {data[:200]!r}"
    status, resp_headers, resp_body = split_response(data)
    assert status == 400, data[:300]
    assert resp_headers["content-type"] == "application/json"
    assert resp_headers["connection"] == "close"
    err = json.loads(resp_body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["code"] == "invalid_framing"
    assert err["type"] == "invalid_request_error"
    assert data.count(b"HTTP/1.1 ") == 1, f"{case}: a second response was sent: {data!r}"
    assert sim.stats()["received"] == before, "the request reached the backend"


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("name_case", [b"content-length", b"CONTENT-LENGTH"])
def test_line_endings_and_name_case_do_not_hide_conflicts(
    gateway: Any, eol: bytes, name_case: bytes
) -> None:
    head = eol.join([b"POST /v1/chat/completions HTTP/1.1", b"Host: gw",
                     name_case + b": %d" % len(CHUNKED), b"transfer-encoding: chunked", b"", b""])
    with connect(gateway.port) as sock:
        sock.sendall(head + CHUNKED + SMUGGLED)
        data, closed = read_until_closed(sock)
    assert closed
    status, _, body = split_response(data)
    # A head with bare LF line ends is refused whatever it says (RFC 9112 §2.2 lets a server
    # refuse them; h11 accepts them): only CRLF heads reach the framing check.
    code = "invalid_framing" if eol == b"\r\n" else "invalid_http_request"
    assert status == 400 and json.loads(body)["error"]["code"] == code
    assert data.count(b"HTTP/1.1 ") == 1


def test_transfer_encoding_in_http10_is_refused(gateway: Any) -> None:
    with connect(gateway.port) as sock:
        sock.sendall(_head(b"/v1/chat/completions", b"Transfer-Encoding: chunked",
                           version=b"HTTP/1.0") + CHUNKED)
        data, closed = read_until_closed(sock)
    assert closed
    status, _, body = split_response(data)
    assert status == 400
    assert json.loads(body)["error"]["code"] == "invalid_framing"


def test_other_malformed_requests_get_openai_json(gateway: Any) -> None:
    with connect(gateway.port) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n")
        data, closed = read_until_closed(sock)
    assert closed
    status, headers, body = split_response(data)
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == "invalid_http_request"


@pytest.mark.parametrize(("head", "status", "code", "says"), [
    (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n",
     431, "request_header_too_large", "larger than the limit of 16384 bytes"),
    (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"X-Many: a\r\n" * 100_000 + b"\r\n",
     431, "request_header_too_large", "larger than the limit of 16384 bytes"),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Secret: sk-abc\x00def\r\n\r\n",
     400, "invalid_http_request", "Invalid HTTP request: illegal header line."),
    (b"GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
     400, "invalid_http_request", "Invalid HTTP request: Found multiple Host: headers."),
    (b"GET /v1/models HTTP/1.1\r\n\r\n",
     400, "invalid_http_request", "Invalid HTTP request: Missing mandatory Host: header."),
], ids=["head-1MB-line", "head-100k-lines", "nul-in-header", "two-hosts", "no-host"])
def test_malformed_requests_are_answered_with_what_was_wrong(
    gateway: Any, head: bytes, status: int, code: str, says: str
) -> None:
    # uvicorn answers every h11 refusal with "Invalid HTTP request received." (400), dropping
    # h11's reason and its 431 hint; the client and the operator reading the answer need both.
    # The offending bytes are never echoed back. (A head in one read: see
    # test_the_head_limit_holds_however_the_head_is_split.)
    with connect(gateway.port) as sock:
        sock.sendall(head)
        data, closed = read_until_closed(sock)
    assert closed
    got, headers, body = split_response(data)
    error = json.loads(body)["error"]
    assert (got, error["code"], headers["content-type"]) == (status, code, "application/json")
    assert error["message"] == says or says in error["message"]
    assert b"sk-abc" not in body and b"aaaa" not in body


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_sound_framing_keeps_the_connection_for_the_next_request(
    gateway: Any, framing: str
) -> None:
    if framing == "chunked":
        first = _head(b"/v1/chat/completions", b"Transfer-Encoding: chunked") + CHUNKED
    else:
        first = _head(b"/v1/chat/completions", b"Content-Length: %d" % len(BODY)) + BODY
    with connect(gateway.port) as sock:
        sock.sendall(first + SMUGGLED)
        data = b""
        while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b'"ok"}'):
            chunk = sock.recv(65536)
            assert chunk, f"closed early: {data!r}"
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 ")
    assert b"HTTP/1.1 200 " in data[10:]


@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/healthz"])
def test_app_refuses_cl_and_te_under_plain_uvicorn(
    serve_asgi: Callable[..., Any], sim: Sim, path: bytes
) -> None:
    """Second layer: the app itself refuses CL+TE and the server closes after the answer."""
    srv = serve_asgi(create_app(settings([sim.url])))  # plain uvicorn h11, no guarded protocol
    headers, body = CASES["cl_and_te"]
    with connect(srv.port) as sock:
        sock.sendall(_head(path, *headers) + body + SMUGGLED)
        data, closed = read_until_closed(sock)
    assert closed
    status, resp_headers, resp_body = split_response(data)
    assert status == 400 and resp_headers["connection"] == "close"
    assert json.loads(resp_body)["error"]["code"] == "invalid_framing"
    assert data.count(b"HTTP/1.1 ") == 1, data


def test_gateway_serve_runs_the_guarded_server(tmp_path: Path, sim: Sim) -> None:
    """``gateway serve`` itself: framing refused, header timeout from the config applied."""
    port = free_port()
    cfg = config([sim.url], limits={"client_header_timeout_s": 1})
    cfg["listen"]["port"] = port
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "VLLM_KEY": "k"},
    )
    try:
        deadline = time.monotonic() + 90  # start-up imports are slow on a loaded machine
        while True:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "gateway serve did not start"
            time.sleep(0.1)
        headers, body = CASES["cl_and_te"]
        with connect(port) as sock:
            sock.sendall(_head(b"/v1/chat/completions", *headers) + body + SMUGGLED)
            data, closed = read_until_closed(sock)
        assert closed and data.count(b"HTTP/1.1 ") == 1
        status, _, resp_body = split_response(data)
        assert status == 400 and json.loads(resp_body)["error"]["code"] == "invalid_framing"
        t0 = time.monotonic()
        with connect(port) as sock:
            idle, closed = read_until_closed(sock, timeout_s=10)
        assert closed and idle == b"" and time.monotonic() - t0 < 5
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def _head_of(size: int) -> bytes:
    """A request head of exactly ``size`` bytes (its blank line included)."""
    start, end = b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Pad: ", b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


@pytest.mark.parametrize("size", [LIMIT - 1, LIMIT, LIMIT + 1, 20_000])
def test_the_head_limit_holds_however_the_head_is_split(size: int) -> None:
    """A head over the 16 KiB limit is refused (431) whether it arrives in one read or in
    several; h11 alone checks only an incomplete head, so one read took any size."""
    head = _head_of(size)
    answers = set()
    for cuts in [(), (1,), (LIMIT // 2,), (LIMIT - 1,), (LIMIT,), (size - 1,), (100, LIMIT)]:
        reader = RequestReader()
        pieces = [head[a:b] for a, b in zip((0, *cuts), (*cuts, len(head)), strict=True)]
        answer: Any = None
        for piece in pieces:
            reader.feed(piece)
            try:
                event = reader.next_event()
            except RequestRefused as exc:
                answer = exc.status
                break
            if isinstance(event, RequestHead):
                answer = "request"
                break
        answers.add(answer)
    assert answers == {"request" if size <= LIMIT else 431}


def test_a_head_over_the_limit_in_one_read_is_answered_431(gateway: Any) -> None:
    with connect(gateway.port) as sock:
        sock.sendall(_head_of(20_000))
        data, closed = read_until_closed(sock)
    assert closed
    status, _, body = split_response(data)
    assert (status, json.loads(body)["error"]["code"]) == (431, "request_header_too_large")


def _answer(pieces: list[bytes]) -> Any:
    """What the server's request reader makes of ``pieces`` (each one read): the requests it
    read, and its refusal (reason and status) if it refused."""
    reader = RequestReader()
    seen: list[Any] = []
    for piece in pieces:
        reader.feed(piece)
        while True:
            try:
                event = reader.next_event()
            except RequestRefused as exc:
                return seen, (str(exc), exc.status)
            if event is None and reader.complete:
                reader.next_request()  # the response was sent
                continue
            if event is None:
                break
            if isinstance(event, RequestHead):
                seen.append(event.target)
    return seen, None


@pytest.mark.parametrize("data", [
    b"\r\n" + _head(b"/v1/models", b"Content-Length: 0"),
    b"\n\r\n\r\n" + _head(b"/v1/models", b"Content-Length: 0"),
    _head(b"/v1/models", b"Content-Length: 2") + b"{}\r\n",
    b"\r\n" * 40_000 + _head(b"/v1/models", b"Content-Length: 0"),
], ids=["empty-line-before", "empty-lines-before", "empty-line-after-body", "80-kB-of-them"])
def test_empty_lines_before_a_request_line_are_ignored_however_split(data: bytes) -> None:
    """RFC 9112 §2.2: a server SHOULD ignore empty lines before a request line (a client may
    end a body with CRLF). h11 refused them ('no request line received', or 'illegal request
    line' when the CR was read alone) and the connection was closed."""
    assert _answer([data]) == ([b"/v1/models"], None)
    for cut in [*range(1, 12), len(data) // 2, len(data) - 1]:
        assert _answer([data[:cut], data[cut:]]) == ([b"/v1/models"], None), cut


def test_a_body_ended_with_crlf_keeps_the_connection_for_the_next_request(gateway: Any) -> None:
    """The stray CRLF after a body was answered with a 400 and a close: a client that sent its
    next request meanwhile read that 400 as its answer."""
    with connect(gateway.port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\n\r\n{}\r\n")
        data = b""
        while data.count(b"HTTP/1.1 ") < 1 or not data.endswith(b"}"):
            data += sock.recv(65536)
        sock.sendall(SMUGGLED)
        while data.count(b"HTTP/1.1 ") < 2 or not data.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, f"closed: {data!r}"
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 ") and data.count(b"HTTP/1.1 200 ") == 2
