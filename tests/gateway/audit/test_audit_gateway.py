"""The audit log wired into the real gateway (uvicorn on loopback, vLLM simulator, openai SDK)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import openai
import pytest
from _audit_helpers import verify

from gateway.app import create_app
from gateway.audit import AuditSettings, Signer, generate_key_file, open_store, write_key_pair
from gateway.audit.observer import build
from gateway.audit.records import Record
from tests.conftest import free_port
from tests.gateway.helpers import BACKEND_KEY, KEY_A, KEY_B, Sim, config, settings

HERE = Path(__file__).parent


def audit_section(tmp_path: Path, store_url: str, signer: Signer, **kw: Any) -> dict[str, Any]:
    key, _ = write_key_pair(signer, tmp_path / "audit.key")
    pseudo = generate_key_file(tmp_path / "pseudonym.key")
    return {
        "store": store_url,
        "signing_key_file": str(key),
        "pseudonym_key_file": str(pseudo),
        "replica_id": "gw1",
        "checkpoint_every_records": 4,
        **kw,
    }


def records_of(url: str, request_id: str) -> list[Record]:
    async def run() -> list[Record]:
        store = open_store(url, read_only=True)
        await store.open()
        try:
            return await store.find_request(request_id)
        finally:
            await store.close()

    return asyncio.run(run())


@pytest.fixture
def audited_gateway(
    serve_asgi: Callable[..., Any], sim: Sim, tmp_path: Path, store_url: str, signer: Signer
) -> Iterator[tuple[str, Any]]:
    observer = build(
        AuditSettings.model_validate(
            audit_section(tmp_path, store_url, signer, store_timeout_s=0.3)
        ),
        config_digest="ab" * 32,
    )
    assert observer is not None
    app = create_app(settings([sim.url]), observers=[observer])
    srv = serve_asgi(app)
    yield srv.url, srv


@pytest.fixture
def audited_client(audited_gateway: tuple[str, Any]) -> Iterator[openai.OpenAI]:
    url, _ = audited_gateway
    with openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0, timeout=20) as client:
        yield client


def test_requests_produce_started_and_completed_records(
    audited_gateway: tuple[str, Any],
    audited_client: openai.OpenAI,
    sim: Sim,
    store_url: str,
    signer: Signer,
) -> None:
    _, srv = audited_gateway
    client = audited_client
    ids: list[str] = []
    for i in range(3):
        raw = client.chat.completions.with_raw_response.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": f"secret prompt {i}"}]
        )
        assert raw.parse().choices[0].message.content
        ids.append(raw.headers["x-request-id"])
    raw = client.chat.completions.with_raw_response.create(
        model="default",
        messages=[{"role": "user", "content": "stream me"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(raw.parse())
    assert chunks[-1].usage is not None
    ids.append(raw.headers["x-request-id"])
    with pytest.raises(openai.PermissionDeniedError) as denied:
        client.chat.completions.create(
            model="other-model", messages=[{"role": "user", "content": "x"}]
        )
    denied_id = denied.value.response.headers["x-request-id"]
    srv.stop()  # lifespan shutdown closes the chain with a final checkpoint

    report = verify(store_url, signer)
    assert report.ok, [str(f) for f in report.errors]
    assert [f.code for f in report.findings] == []
    dump = b"".join(r.body for rid in ids for r in records_of(store_url, rid))
    assert b"secret prompt" not in dump and b"stream me" not in dump
    for rid in ids:
        recs = records_of(store_url, rid)
        assert [r.type for r in recs] == ["request.started", "request.completed"]
        started, done = recs[0].decoded()["data"], recs[1].decoded()["data"]
        assert started["key_id"] == "team-a" and started["team"] == "a"
        assert started["canonical_model"] == "llama-3.1-8b" and started["decision"] == "allow"
        assert started["client"].startswith("hmac-sha256:") and "127.0.0.1" not in started["client"]
        assert started["bytes_in"] > 0 and started["data_class"] == "internal"
        for field in ("destination", "region", "policy_rule", "policy_revision", "started_us"):
            assert field in started
        assert done["outcome"] == "ok" and done["status"] == 200 and done["attempts"] == 1
        assert done["input_tokens"] > 0 and done["output_tokens"] > 0
        assert done["latency_us"] > 0 and done["ttft_us"] > 0 and done["bytes_out"] > 0
        assert recs[0].seq < recs[1].seq
    [denied_rec] = records_of(store_url, denied_id)
    data = denied_rec.decoded()["data"]
    assert denied_rec.type == "request.denied"
    assert (data["outcome"], data["status"], data["decision"]) == ("denied", 403, "deny")
    assert sim.stats()["received"] == 4


def test_audit_store_down_means_503_and_no_upstream_call(
    audited_client: openai.OpenAI, sim: Sim, store_url: str
) -> None:
    client = audited_client
    client.chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "a"}]
    )
    assert sim.stats()["received"] == 1
    lock: sqlite3.Connection | None = None
    if store_url.startswith("sqlite://"):
        lock = sqlite3.connect(store_url[len("sqlite://") :], isolation_level=None)
        lock.execute("BEGIN EXCLUSIVE")
    else:
        name = store_url.rsplit("/", 1)[1]

        async def drop() -> None:
            admin = await asyncpg.connect(store_url.rsplit("/", 1)[0] + "/postgres")
            try:
                await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            finally:
                await admin.close()

        asyncio.run(drop())
    try:
        for stream in (False, True):
            with pytest.raises(openai.InternalServerError) as err:
                client.chat.completions.create(
                    model="llama-3.1-8b",
                    messages=[{"role": "user", "content": "b"}],
                    stream=stream,
                )
            assert err.value.status_code == 503
            assert err.value.code == "audit_unavailable"
        assert sim.stats()["received"] == 1, "the backend must not be called unaudited"
    finally:
        if lock is not None:
            lock.execute("ROLLBACK")
            lock.close()
    if lock is not None:  # the store is back: requests are served (and audited) again
        client.chat.completions.create(
            model="llama-3.1-8b", messages=[{"role": "user", "content": "c"}]
        )
        assert sim.stats()["received"] == 2


def test_sigkilled_gateway_has_completion_records_for_every_delivered_response(
    serve_asgi: Callable[..., Any], sim: Sim, tmp_path: Path, store_url: str, signer: Signer
) -> None:
    cfg_file = tmp_path / "gw.json"
    cfg_file.write_text(
        json.dumps(
            {
                "gateway": config([sim.url]),
                "env": {"VLLM_KEY": BACKEND_KEY},
                "audit": audit_section(tmp_path, store_url, signer, checkpoint_every_records=50),
            }
        )
    )
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    delivered: list[str] = []
    stop = threading.Event()

    def client_loop(stream: bool) -> None:
        body = {
            "model": "llama-3.1-8b",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": stream,
        }
        with httpx.Client(timeout=10) as http:
            while not stop.is_set():
                try:
                    r = http.post(
                        base + "/v1/chat/completions",
                        headers={"authorization": f"Bearer {KEY_A}"},
                        json=body,
                    )
                except httpx.HTTPError:
                    return
                complete = b"data: [DONE]" in r.content if stream else bool(r.json()["choices"])
                if r.status_code == 200 and complete:
                    delivered.append(r.headers["x-request-id"])

    with subprocess.Popen(
        [sys.executable, str(HERE / "_audit_gateway_proc.py"), str(cfg_file), str(port)],
        cwd=Path(__file__).parents[3],
    ) as proc:
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(base + "/healthz", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    assert proc.poll() is None and time.monotonic() < deadline
                    time.sleep(0.1)
            threads = [threading.Thread(target=client_loop, args=(i % 2 == 1,)) for i in range(4)]
            for t in threads:
                t.start()
            while len(delivered) < 60 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            stop.set()
    for t in threads:
        t.join(15)
    assert len(delivered) >= 60
    for rid in delivered:
        types = [r.type for r in records_of(store_url, rid)]
        assert types == ["request.started", "request.completed"], (rid, types)
    report = verify(store_url, signer)
    assert report.ok, [str(f) for f in report.errors]


def test_disabled_or_absent_audit_builds_nothing(tmp_path: Path) -> None:
    assert build(None) is None
    assert build({"enabled": False}) is None
    with pytest.raises(Exception, match="replica_id"):
        build({"replica_id": "bad id with spaces"})
    assert KEY_B  # the second key exists for the other tests of this package
