"""The gateway served as ``gateway serve`` serves it
(:class:`gateway.serving.server.GatewayServer`).

``tests/conftest.py``'s ``serve_asgi`` runs plain uvicorn h11; the tests of the client-facing
HTTP behaviour (framing, timeouts, connection cap) need the production server instead.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

from gateway.app import create_app, direct_routes
from gateway.config.settings import GatewaySettings
from gateway.h1.refusal import RefusalHook
from gateway.serving.server import GatewayServer, ServerConfig, server_limits
from tests.conftest import free_port


class GuardedServer:
    """``create_app(settings)`` on loopback, served as ``gateway serve`` serves it."""

    def __init__(self, settings: GatewaySettings, app: Any = None,
                 on_refused: RefusalHook | None = None, **options: Any) -> None:
        self.port = free_port()
        max_body = settings.limits.max_body_bytes
        # The relay paths go straight to the relay, as with ``gateway serve``, unless the
        # test serves its own app.
        options.setdefault("routes", direct_routes() if app is None else {})
        config = ServerConfig(app or create_app(settings), host="127.0.0.1", port=self.port,
                              limits=server_limits(settings.limits),
                              body_limit=lambda: max_body, on_refused=on_refused, **options)
        self.server = GatewayServer(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()),
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> GuardedServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            assert self.thread.is_alive(), "gateway server thread died during start-up"
            assert time.monotonic() < deadline, "gateway server did not start"
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class Servers:
    """Starts guarded servers (``servers.start(settings)``); ``stop_all()`` at teardown."""

    def __init__(self) -> None:
        self._running: list[GuardedServer] = []

    def start(self, settings: GatewaySettings, app: Any = None, **options: Any) -> GuardedServer:
        srv = GuardedServer(settings, app, **options).start()
        self._running.append(srv)
        return srv

    def stop_all(self) -> None:
        for srv in reversed(self._running):
            srv.stop()


def connect(port: int, timeout_s: float = 5.0) -> socket.socket:
    """A raw TCP connection to the server."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    return sock


def read_until_closed(sock: socket.socket, timeout_s: float = 5.0) -> tuple[bytes, bool]:
    """Everything the server sends until it closes (``True``) or ``timeout_s`` passes."""
    sock.settimeout(0.2)
    data = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def split_response(data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Status, lower-case headers and body of the first response in ``data``."""
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        body = body[: int(headers["content-length"])]
    return status, headers, body


CHAT_BODY = b'{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hello"}]}'


def busy_request(port: int, key: str, source: str | None = None) -> socket.socket:
    """A connection carrying a keyed chat request whose body is half sent.

    Returns once the server answered ``100 Continue``: the head was complete, the app took the
    request and waits for the rest of its body (send ``CHAT_BODY[len(CHAT_BODY) // 2:]`` to
    finish it). ``source``: the local address to connect from (another loopback address).
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=5,
                                    source_address=(source, 0) if source else None)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
                 b"Authorization: Bearer " + key.encode() + b"\r\n"
                 b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(CHAT_BODY))
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        assert chunk, f"closed before 100 Continue: {answer!r}"
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 100 "), answer
    sock.sendall(CHAT_BODY[: len(CHAT_BODY) // 2])
    return sock
