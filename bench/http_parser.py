"""Client-facing HTTP parser: framing behaviour and bare throughput, side by side.

Compares uvicorn's plain h11 protocol, the gateway's own server (:mod:`gateway.h1.server`,
strict sans-IO request reader) and, when installed, uvicorn's httptools (llhttp) protocol, on a
trivial ASGI app:

1. Framing: each ambiguous request of ``CASES`` is sent on a raw socket followed by a second
   request; prints the status, whether the second (smuggled) request was served and whether the
   connection was closed.
2. Throughput: ``--requests`` keep-alive POSTs over ``--connections`` connections, ``--rounds``
   interleaved rounds; prints requests per second per round.

httptools is not a gateway dependency; to include it, install it into a scratch environment
(``uv pip install httptools``). Usage: ``.venv/bin/python bench/http_parser.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import socket
import threading
import time
from typing import Any

import uvicorn

from gateway.serving.server import GatewayServer, ServerConfig

SERVED: list[str] = []

CASES = {
    "CL + TE chunked": b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "TE gzip, chunked": b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
    "TE chunked, identity": b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    "TE twice": b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "CL twice, equal": b"Content-Length: 2\r\nContent-Length: 2\r\n\r\nhi",
    "CL twice, different": b"Content-Length: 2\r\nContent-Length: 3\r\n\r\nhi!",
    "CL list 2, 2": b"Content-Length: 2, 2\r\n\r\nhi",
    "CL +2": b"Content-Length: +2\r\n\r\nhi",
    "obs-fold TE": b"Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n",
    "obs-fold CL": b"Content-Length:\r\n 2\r\n\r\nhi",
}
SMUGGLED = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    while (await receive()).get("more_body"):
        pass
    SERVED.append(scope["path"])
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    def __init__(self, parser: str) -> None:
        self.port = _free_port()
        self.server: Any
        if parser == "gateway":
            self.server = GatewayServer(ServerConfig(app, host="127.0.0.1", port=self.port))
        else:
            self.server = uvicorn.Server(uvicorn.Config(
                app, host="127.0.0.1", port=self.port, loop="asyncio", http=parser,
                lifespan="on", log_level="critical"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()),
                                       daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def _framing(port: int, headers: bytes) -> str:
    SERVED.clear()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"POST /a HTTP/1.1\r\nHost: x\r\n" + headers + SMUGGLED)
        sock.settimeout(1.0)
        data = b""
        closed = False
        try:
            while chunk := sock.recv(65536):
                data += chunk
            closed = True
        except TimeoutError:
            pass
        except ConnectionResetError:
            closed = True
    status = data.split(b"\r\n", 1)[0].decode(errors="replace").removeprefix("HTTP/1.1 ")
    kind = "json" if b"application/json" in data else "text"
    smuggled = "second request served" if "/smuggled" in SERVED else "-"
    return f"{status[:3]} {kind}, {smuggled}, {'closed' if closed else 'open'}"


async def _client(port: int, n: int, request: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(n):
        writer.write(request)
        await reader.readuntil(b"\r\n\r\nok")
    writer.close()


def _throughput(port: int, requests: int, connections: int) -> float:
    body = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * 400 + b'"}]}'
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
               b"Content-Type: application/json\r\nAuthorization: Bearer abc\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))

    async def main() -> None:
        per = requests // connections
        await asyncio.gather(*(_client(port, per, request) for _ in range(connections)))

    t0 = time.perf_counter()
    asyncio.run(main())
    return requests / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    parsers = ["h11", "gateway"]
    if importlib.util.find_spec("httptools") is not None:
        parsers.append("httptools")
    print("framing (status and body type, request sent after the body, connection):")
    for parser in parsers:
        with _Server(parser) as srv:
            for case, headers in CASES.items():
                print(f"  {parser:12} {case:22} {_framing(srv.port, headers)}")
    print(f"throughput, req/s ({args.requests} POSTs over {args.connections} connections):")
    results: dict[str, list[float]] = {p: [] for p in parsers}
    for _ in range(args.rounds):
        for parser in parsers:
            with _Server(parser) as srv:
                results[parser].append(_throughput(srv.port, args.requests, args.connections))
    for parser, values in results.items():
        print(f"  {parser:12} " + " ".join(f"{v:8.0f}" for v in values))


if __name__ == "__main__":
    main()
