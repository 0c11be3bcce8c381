"""A response's records never say the client got what it did not (tester's F3, F5), through a
real ``gateway serve`` (its own HTTP/1.1 server) on loopback with a SQLite audit log.

The final record of a response (``request.completed``, ``mcp.tool_call``) is durable before the
response's last bytes go out. When the client hangs up while that record waits for the store
(another process holds the write lock), the answer never reaches it: the gateway then appends
``request.undelivered`` / ``mcp.undelivered`` with the body bytes the client's connection was
handed. A client that leaves while the *first* record (``request.started``, ``mcp.started``)
waits for the store gets nothing forwarded on its behalf, and the final record says
``client_disconnect`` with no bytes out. A request body the server itself refuses mid-way (a
chunk size over ``limits.max_body_bytes``: its own 413) is recorded as that 413, not as a
client that left.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import wait_until
from tests.gateway.helpers import audit_export, take_request_body
from tests.gateway.mcp_gateway.harness import KEYS, Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import call, headers
from tests.gateway.mcp_gateway.test_mcp_hostile_round4 import ACCESS
from tests.gateway.mcp_gateway.upstreams import status_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

_LISTEN = 0x0A  # /proc/net/tcp state of a listening socket
_LAST_ACK = 0x09  # the server closed its side after the client's FIN


def _committed(db: Path, kind: str) -> list[dict[str, Any]]:
    """The ``kind`` records committed now (a reader of the WAL database sees only committed
    transactions), as their ``data``."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute("SELECT body FROM audit_records WHERE type = ? ORDER BY id",
                            (kind,)).fetchall()
    docs = [json.loads(body) for (body,) in rows]
    return [d.get("data", d) for d in docs]


def _server_side(server_port: int, client_port: int) -> tuple[int, int] | None:
    """``(state, receive queue bytes)`` of the gateway's socket of the connection from
    ``client_port`` (``/proc/net/tcp``), or ``None`` once the gateway has closed it."""
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local, remote, state = fields[1], fields[2], int(fields[3], 16)
            rx = int(fields[4].split(":")[1], 16)
            if (int(local.split(":")[1], 16) == server_port
                    and int(remote.split(":")[1], 16) == client_port and state != _LISTEN):
                return state, rx
    return None


def _gateway_read_all(port: int, sock: socket.socket) -> None:
    """Wait until the gateway has read every byte the client sent on ``sock``."""
    me = sock.getsockname()[1]
    wait_until(lambda: (_server_side(port, me) or (0, 0))[1] == 0, 10,
               "the gateway to read the request")


def _hang_up(port: int, sock: socket.socket) -> None:
    """Close ``sock`` and wait until the gateway has seen it (closed its own side)."""
    me = sock.getsockname()[1]
    sock.close()
    wait_until(lambda: (_server_side(port, me) or (_LAST_ACK, 0))[0] == _LAST_ACK, 10,
               "the gateway to notice the client left")


def _read_head(sock: socket.socket, until: bytes = b"\r\n\r\n") -> bytes:
    """Read until a response head (or ``until``) has come (10 s at most)."""
    sock.settimeout(10)
    got = b""
    while until not in got:
        data = sock.recv(65536)
        assert data, got
        got += data
    return got


class _Lock:
    """Another process's write lock on the audit database (``BEGIN EXCLUSIVE``), held
    under the gateway's 5 s busy timeout."""

    def __init__(self, db: Path) -> None:
        self.conn = sqlite3.connect(str(db), isolation_level=None)
        self.conn.execute("BEGIN EXCLUSIVE")

    def release(self) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()

    def __enter__(self) -> _Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


@pytest.fixture
def stack(serve_asgi: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``gateway serve`` in front of the simulator (1 s to the first token, then one per
    10 ms) and
    :func:`status_server` (a call whose arguments say ``delay`` answers after 0.5 s)."""
    received: list[dict[str, Any]] = []
    inner = status_server(received)

    async def upstream(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        body, replay = await take_request_body(receive)
        if b'"delay"' in body:
            await asyncio.sleep(0.5)
        await inner(scope, replay, send)

    sim = serve_asgi(create_sim(SimConfig(models=["m"], ttft_s=1.0, itl_s=0.01)))
    evil = serve_asgi(upstream)

    def extra(mcp: dict[str, Any]) -> None:
        mcp["access"] = ACCESS

    gw = start_gateway(tmp_path, sim.url, {"evil": evil.url + "/mcp"}, {}, extra)
    try:
        yield {"gateway": gw, "received": received, "sim": sim}
    finally:
        gw.stop()


def _port(gw: Gateway) -> int:
    return int(gw.url.rsplit(":", 1)[1])


def _mcp_request(rid: int) -> bytes:
    body = json.dumps(call("answer", {"status": 200, "body": "result", "delay": 1},
                           rid)).encode()
    return (b"POST /mcp/evil HTTP/1.1\r\nHost: gw\r\n"
            + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers(name="answer").items())
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def _chat_request(stream: bool) -> bytes:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 16, "stream": stream}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
            b"Authorization: Bearer " + KEYS["agent"].encode() + b"\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)


def _calls(received: list[dict[str, Any]]) -> int:
    return sum(1 for m in received if m.get("method") == "tools/call")


def _by_id(db: Path, kind: str) -> dict[str, dict[str, Any]]:
    return {r["request_id"]: r for r in _committed(db, kind)}


def _warm(gw: Gateway, port: int) -> None:
    """One delivered call (the tool catalogue is fetched and cached): its records say so."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(_mcp_request(1))
        assert _read_head(sock).startswith(b"HTTP/1.1 200 ")


def test_an_mcp_answer_lost_while_its_record_waits_gets_a_follow_up_record(
        stack: dict[str, Any]) -> None:
    """The client hangs up while ``mcp.tool_call`` waits for the store: it got the head, no
    byte of the body. Before, the record said status 200 with every byte out and nothing
    followed it."""
    gw: Gateway = stack["gateway"]
    port = _port(gw)
    _warm(gw, port)
    wait_until(lambda: len(_committed(gw.db, "mcp.tool_call")) == 1, 10, "the warm-up record")
    before = set(_by_id(gw.db, "mcp.started"))
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(_mcp_request(2))
    wait_until(lambda: len(_by_id(gw.db, "mcp.started")) == len(before) + 1, 10,
               "the call's mcp.started")
    with _Lock(gw.db):
        head = _read_head(sock)  # the answer came; its record waits for the lock
        assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n"), head
        _hang_up(port, sock)
    [rid] = set(_by_id(gw.db, "mcp.started")) - before
    wait_until(lambda: rid in _by_id(gw.db, "mcp.undelivered"), 10, "mcp.undelivered")
    final = _by_id(gw.db, "mcp.tool_call")[rid]
    follow = _by_id(gw.db, "mcp.undelivered")[rid]
    # Durable before the answer's last bytes: it says what was to be sent...
    assert final["status"] == 200 and final["bytes_out"] > 0 and "outcome" not in final
    # ... and the follow-up what the client was handed: the head, no byte of the body.
    assert follow == {"request_id": rid, "outcome": "client_disconnect", "bytes_out": 0,
                      "bytes_recorded": final["bytes_out"]}


def test_an_mcp_call_whose_client_left_during_its_started_record_is_not_forwarded(
        stack: dict[str, Any]) -> None:
    """The client leaves while ``mcp.started`` waits for the store: the call is not sent to
    its server (before, it was, and its tool ran for nobody), and the final record says
    ``client_disconnect``, nothing sent."""
    gw: Gateway = stack["gateway"]
    port = _port(gw)
    _warm(gw, port)
    wait_until(lambda: len(_committed(gw.db, "mcp.tool_call")) == 1, 10, "the warm-up record")
    calls, before = _calls(stack["received"]), set(_by_id(gw.db, "mcp.started"))
    with _Lock(gw.db):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(_mcp_request(2))
        _gateway_read_all(port, sock)
        _hang_up(port, sock)
    wait_until(lambda: len(_by_id(gw.db, "mcp.tool_call")) == 2, 10, "the final record")
    [rid] = set(_by_id(gw.db, "mcp.started")) - before
    final = _by_id(gw.db, "mcp.tool_call")[rid]
    assert (final["outcome"], final["bytes_out"], final["status"]) == \
        ("client_disconnect", 0, 0), final
    assert final["forwarded"] is False
    assert _calls(stack["received"]) == calls, "the call was forwarded for a client gone"
    assert rid not in _by_id(gw.db, "mcp.undelivered")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_model_answer_lost_while_its_record_waits_gets_a_follow_up_record(
        stack: dict[str, Any], stream: bool) -> None:
    """The client hangs up while ``request.completed`` waits for the store, before the end
    of the answer went out. Before, the record said outcome ok with every byte out."""
    gw: Gateway = stack["gateway"]
    port = _port(gw)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(_chat_request(stream))
    wait_until(lambda: len(_committed(gw.db, "request.started")) == 1, 10, "request.started")
    with _Lock(gw.db):
        # The answer came whole from the model; its end is held for the record.
        assert _read_head(sock).startswith(b"HTTP/1.1 200 ")
        wait_until(lambda: httpx.get(stack["sim"].url + "/sim/stats", timeout=10).json()
                   ["completed"] == 1, 10, "the model's answer to end")
        _hang_up(port, sock)
    wait_until(lambda: len(_committed(gw.db, "request.undelivered")) == 1, 10,
               "request.undelivered")
    [final] = _committed(gw.db, "request.completed")
    [follow] = _committed(gw.db, "request.undelivered")
    assert final["outcome"] == "ok" and final["status"] == 200
    assert follow["request_id"] == final["request_id"]
    assert follow["outcome"] == "client_disconnect"
    assert follow["bytes_recorded"] == final["bytes_out"]
    if stream:  # the events went, but the held end (the piece with data: [DONE])
        assert 0 < follow["bytes_out"] <= final["bytes_out"] - len(b"data: [DONE]\n\n"), \
            follow
    else:  # a sized body's only chunk is held for the record: none of it went
        assert follow["bytes_out"] == 0, follow


def test_a_model_request_whose_client_left_during_its_started_record_is_not_forwarded(
        stack: dict[str, Any]) -> None:
    gw: Gateway = stack["gateway"]
    port = _port(gw)
    with _Lock(gw.db):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(_chat_request(False))
        _gateway_read_all(port, sock)
        _hang_up(port, sock)
    wait_until(lambda: len(_committed(gw.db, "request.completed")) == 1, 10,
               "request.completed")
    [final] = _committed(gw.db, "request.completed")
    assert (final["outcome"], final["bytes_out"]) == ("client_disconnect", 0), final
    stats = httpx.get(stack["sim"].url + "/sim/stats", timeout=10).json()
    assert stats["received"] == 0, stats  # never forwarded


def _refused_midway(gw: Gateway, start: bytes, record_type: str) -> dict[str, Any]:
    """Send ``start`` (a chunked request's head and first chunk), wait until the gateway read
    it, then announce a chunk over ``limits.max_body_bytes``: the server answers 413 itself.
    Returns the one ``record_type`` record committed for it."""
    with socket.create_connection(("127.0.0.1", _port(gw))) as sock:
        sock.sendall(start)
        _gateway_read_all(_port(gw), sock)
        sock.sendall(b"2000000\r\n")
        head = _read_head(sock)
        assert head.startswith(b"HTTP/1.1 413 "), head
    wait_until(lambda: len(_committed(gw.db, record_type)) == 1, 10, record_type)
    [record] = _committed(gw.db, record_type)
    return record


def test_a_body_the_server_refuses_midway_is_recorded_as_its_413(
        stack: dict[str, Any]) -> None:
    """A chunk size over ``limits.max_body_bytes``: the server answers 413 itself. Before,
    the relay recorded ``request.denied`` with status 0 and outcome client_disconnect."""
    gw: Gateway = stack["gateway"]
    denied = _refused_midway(
        gw, b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
        b"Authorization: Bearer " + KEYS["agent"].encode() + b"\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"10\r\n" + b'{"model":"m",   ' + b"\r\n", "request.denied")
    assert denied["key_id"] == "k-agent"
    assert (denied["status"], denied["outcome"]) == (413, "invalid"), denied
    assert denied["error_code"] == "request_too_large", denied
    assert denied["bytes_out"] > 0
    kinds = [r["type"] for r in audit_export(f"sqlite://{gw.db}")]  # once all is written
    assert "request.undelivered" not in kinds, kinds  # the server's own answer went out


def test_an_mcp_body_the_server_refuses_midway_is_recorded_as_its_413(
        stack: dict[str, Any]) -> None:
    """The same for an MCP call: before, ``mcp.refused`` said 400 ``client_gone``."""
    gw: Gateway = stack["gateway"]
    hdrs = "".join(f"{k}: {v}\r\n" for k, v in headers(name="answer").items()).encode()
    refused = _refused_midway(
        gw, b"POST /mcp/evil HTTP/1.1\r\nHost: gw\r\n" + hdrs
        + b"Transfer-Encoding: chunked\r\n\r\n10\r\n" + b'{"jsonrpc":"2.0"\r\n', "mcp.refused")
    assert (refused["status"], refused["reason"]) == (413, "request_too_large"), refused
    assert refused["key_id"] == "k-agent" and refused["bytes_out"] > 0
    assert "outcome" not in refused
