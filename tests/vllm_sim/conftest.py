"""Fixtures for the simulator tests: a simulator on a real uvicorn and a raw HTTP/1.1 client.

The raw client keeps the chunked-transfer framing visible, so tests can assert where the
simulator cut its writes (``split_writes``) and how it framed events (``crlf``).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest

from vllm_sim import SimConfig, create_app


class Sim:
    """A running simulator: its URL, an SDK client and control helpers."""

    def __init__(self, url: str, port: int) -> None:
        self.url = url
        self.port = port
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0)

    def fault(self, **spec: Any) -> dict[str, Any]:
        resp = httpx.post(f"{self.url}/sim/faults", json=spec)
        resp.raise_for_status()
        return dict(resp.json())

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(f"{self.url}/sim/stats").json())

    def wait_stats(
        self, pred: Callable[[dict[str, Any]], bool], timeout_s: float = 5.0
    ) -> dict[str, Any]:
        """Poll ``/sim/stats`` until ``pred`` holds (the server notices disconnects async)."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.stats()
            if pred(stats) or time.monotonic() > deadline:
                return stats
            time.sleep(0.02)


@pytest.fixture
def start_sim(serve_asgi: Callable[..., Any]) -> Iterator[Callable[..., Sim]]:
    """Factory: ``start_sim(**SimConfig fields) -> Sim`` on a real uvicorn on loopback."""
    sims: list[Sim] = []

    def start(**config: Any) -> Sim:
        srv = serve_asgi(create_app(SimConfig(**config)))
        sim = Sim(srv.url, srv.port)
        sims.append(sim)
        return sim

    yield start
    for sim in sims:
        sim.client.close()


@pytest.fixture
def sim(start_sim: Callable[..., Sim]) -> Sim:
    """A simulator with the default configuration (model ``sim-model``)."""
    return start_sim()


def _dechunk(raw: bytes) -> list[bytes]:
    """Split an HTTP/1.1 chunked body into its chunks (RFC 9112 §7.1); stops at a cut."""
    chunks = []
    pos = 0
    while True:
        eol = raw.find(b"\r\n", pos)
        if eol < 0:
            return chunks
        size = int(raw[pos:eol].split(b";")[0], 16)
        if size == 0:
            chunks.append(b"")  # the terminating chunk
            return chunks
        start = eol + 2
        if start + size > len(raw):
            return chunks
        chunks.append(raw[start : start + size])
        pos = start + size + 2


class RawResponse:
    """Status line, headers and the body's transfer chunks of a raw HTTP/1.1 exchange."""

    def __init__(self, raw: bytes) -> None:
        head, _, body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {
            k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])
        }
        self.raw_body = body
        chunked = self.headers.get("transfer-encoding") == "chunked"
        self.chunks = _dechunk(body) if chunked else [body]
        self.complete = (not chunked) or (bool(self.chunks) and self.chunks[-1] == b"")

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


@pytest.fixture
def raw_post() -> Callable[..., RawResponse]:
    """``raw_post(port, path, body) -> RawResponse`` over a plain socket (Connection: close)."""

    def post(port: int, path: str, body: bytes, timeout_s: float = 10.0) -> RawResponse:
        req = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(req)
            parts = []
            while True:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    break
                if not data:
                    break
                parts.append(data)
        return RawResponse(b"".join(parts))

    return post
