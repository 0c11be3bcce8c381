"""Shared helpers for the gateway tests: a simulator + gateway pair on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import openai

from gateway.app import create_app
from gateway.audit import export_records, open_store
from gateway.config.loader import parse
from gateway.config.settings import GatewaySettings
from gateway.relay.records import RequestRecord
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

KEY_A = "sg-test-key-team-a"
KEY_B = "sg-test-key-team-b"
BACKEND_KEY = "backend-secret-123"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def config(replica_urls: list[str], **overrides: Any) -> dict[str, Any]:
    """A gateway config dict with one model over ``replica_urls`` and two keys."""
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [
            {
                "name": "llama-3.1-8b",
                "aliases": ["default"],
                "served_model_name": SERVED,
                "replicas": [{"url": u, "api_key_env": "VLLM_KEY"} for u in replica_urls],
            },
            {
                "name": "other-model",
                "served_model_name": SERVED,
                "replicas": [{"url": replica_urls[0]}],
            },
        ],
        "keys": [
            {"id": "team-a", "sha256": sha(KEY_A), "models": ["llama-3.1-8b"], "team": "a"},
            {"id": "team-b", "sha256": sha(KEY_B), "models": ["other-model"]},
        ],
        "timeouts": {"connect_s": 1, "first_byte_s": 5, "idle_s": 5},
        "health": {"active": False, "cooldown_s": 30},
        "logging": {"access_log": False},
        # A stopped ``gateway serve`` keeps accepting for delay_s (5 s by default: load
        # balancers' time to notice); no test has one in front, so a stop is not 5 s of sleep.
        # The drain tests give their own drain: section.
        "drain": {"delay_s": 0},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def settings(replica_urls: list[str], **overrides: Any) -> GatewaySettings:
    return parse(config(replica_urls, **overrides), {"VLLM_KEY": BACKEND_KEY})


@dataclass
class Sim:
    url: str

    def stats(self) -> dict[str, Any]:
        r = httpx.get(self.url + "/sim/stats", timeout=5)
        r.raise_for_status()
        return dict(r.json())

    def fault(self, **spec: Any) -> None:
        r = httpx.post(self.url + "/sim/faults", json=spec, timeout=5)
        r.raise_for_status()

    def reset(self) -> None:
        httpx.post(self.url + "/sim/reset", timeout=5).raise_for_status()


def start_sim(serve_asgi: Callable[..., Any], **cfg: Any) -> Sim:
    cfg.setdefault("models", [SERVED])
    srv = serve_asgi(create_sim(SimConfig(**cfg)))
    return Sim(srv.url)


def start_gateway(serve_asgi: Callable[..., Any], s: GatewaySettings, **kwargs: Any) -> str:
    srv = serve_asgi(create_app(s, **kwargs))
    return str(srv.url)


def sse_events(raw: bytes) -> list[Any]:
    """Parse the data payloads of an SSE body (test-side, independent of gateway.relay.rewrite)."""
    out: list[Any] = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


class Stream(threading.Thread):
    """One streamed chat completion on its own connection, read raw (bytes as sent) in a thread.

    Args:
        url: Base URL of the gateway (or of a simulator, to compare).
        key: The API key sent as ``Authorization: Bearer``.
        max_tokens: Tokens asked for (with the simulator's inter-token latency: the length).
        model: The model name sent.
        include_usage: Ask for the final usage event (``stream_options``).

    Attributes:
        status: The response status (0 until the head arrived).
        body: The raw body received so far.
        error: The transport error that ended the stream, if any.
    """

    def __init__(self, url: str, key: str = KEY_A, max_tokens: int = 100, *,
                 model: str = "default", include_usage: bool = False) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.max_tokens = url, key, max_tokens
        self.model, self.include_usage = model, include_usage
        self.status = 0
        self.body = b""
        self.error: Exception | None = None

    def run(self) -> None:
        body: dict[str, Any] = {"model": self.model, "stream": True,
                                "max_tokens": self.max_tokens,
                                "messages": [{"role": "user", "content": "hi"}]}
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        try:
            with httpx.Client(timeout=60) as client, client.stream(
                    "POST", self.url + "/v1/chat/completions", json=body,
                    headers={"authorization": f"Bearer {self.key}"}) as resp:
                self.status = resp.status_code
                for chunk in resp.iter_raw():
                    self.body += chunk
        except httpx.HTTPError as exc:
            self.error = exc

    @property
    def events(self) -> list[Any]:
        """The SSE data payloads received so far (``"[DONE]"`` or parsed JSON)."""
        return sse_events(self.body)


class Recorder:
    """A request observer that keeps what it saw."""

    def __init__(self) -> None:
        self.started: list[RequestRecord] = []
        self.ended: list[RequestRecord] = []

    async def on_start(self, record: RequestRecord) -> None:
        self.started.append(record)

    async def on_end(self, record: RequestRecord) -> None:
        self.ended.append(record)

    def wait(self, n: int, timeout_s: float = 5.0) -> list[RequestRecord]:
        """The ended records once there are ``n`` (on_end runs after the client got its bytes)."""
        deadline = time.monotonic() + timeout_s
        while len(self.ended) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.ended) == n, self.ended
        return self.ended


class Clients:
    """Makes openai SDK clients (no SDK retries) and closes them all at teardown."""

    def __init__(self) -> None:
        self._open: list[openai.OpenAI] = []

    def __call__(self, url: str, key: str = KEY_A) -> openai.OpenAI:
        client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=20)
        self._open.append(client)
        return client

    def close(self) -> None:
        for client in self._open:
            client.close()


def stop_processes(procs: Sequence[subprocess.Popen[Any]], grace_s: float = 10.0) -> None:
    """SIGTERM every process at once, wait up to ``grace_s`` seconds for each, SIGKILL what is
    left, and close their captured stderr."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


async def take_request_body(receive: Any) -> tuple[bytes, Any]:
    """For a test ASGI wrapper that looks at a request's body before its app does: the whole
    body, and a ``receive`` that hands the same body to the app once, then the real
    ``receive`` (disconnects)."""
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return dict(await receive())

    return body, replay


def audit_export(store: str, since: str | None = None, settle_s: float = 0.3,
                 timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """The records of an audit store as ``gateway audit export --store STORE [--since SINCE]``
    prints them (one JSON object per record, in insertion order), read in this process once
    no record has come for ``settle_s``.

    A gateway writes some records just after its answer (a request's completion, a counted
    refusal): the store is read until two reads ``settle_s`` apart agree, so a test reads
    what its requests caused, as it did through the CLI (whose start took about a second).
    Reading in-process saves that start; the CLI itself is tested in tests/gateway/audit
    (test_audit_serve.py, test_audit_proof.py).

    Args:
        store: ``sqlite://PATH`` or ``postgresql://...``; opened read-only.
        since: ISO 8601 time, inclusive (a time without a zone is UTC), or None for all.
        settle_s: Seconds without a new record before the read counts (0: read once).
        timeout_s: Seconds to wait at most for the store to settle; then the last read.

    Raises:
        AuditUnavailable: If the store cannot be read.
    """
    since_us = None
    if since is not None:
        when = datetime.fromisoformat(since)
        when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
        since_us = int(when.timestamp() * 1_000_000)

    async def read() -> list[dict[str, Any]]:
        st = open_store(store, read_only=True)
        await st.open()
        try:
            return [json.loads(rec.body) async for rec in export_records(st, since_us)]
        finally:
            await st.close()

    records = asyncio.run(read())
    deadline = time.monotonic() + timeout_s
    while settle_s > 0 and time.monotonic() < deadline:
        time.sleep(settle_s)
        again = asyncio.run(read())
        if len(again) == len(records):
            return again
        records = again
    return records
