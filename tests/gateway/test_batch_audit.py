"""The Batch API under the strict JSON reader and in the audit chain.

Found by a tester (2026-12-05): batch input lines and the create body were read with
``json.loads``, so a lone surrogate escape stored a batch and ran it behind a 500 (and broke
the key's listing for good), deep nesting was a 500, and a repeated key silently took the last
value; uploads, batches, cancels and deletes left no audit record, a line refused because its
owner was no longer allowed had no request id and no record, and nothing linked a batch's
requests to it. Real parts: the gateway as ``gateway serve`` assembles it (SQLite audit chain)
on loopback, the simulator as the replica, the official ``openai`` SDK.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.audit import Signer, generate_key_file, open_store, write_key_pair
from gateway.audit.records import parse_body
from gateway.batch.events import batch_trace_id
from gateway.config.loader import parse
from gateway.config.settings import GatewaySettings
from tests.gateway.helpers import SERVED, sha, start_sim
from tests.gateway.test_batch_api import (
    KEYS,
    client,
    error_lines,
    jsonl,
    settings,
    submit,
    wait_batch,
)


def audited(sim_url: str, tmp_path: Path, keys: tuple[str, ...] = tuple(KEYS),
            concurrency: int = 2) -> GatewaySettings:
    if not (tmp_path / "audit.key").exists():
        write_key_pair(Signer.generate(), tmp_path / "audit.key")
        generate_key_file(tmp_path / "pseudonym.key")
    return parse({
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": "m", "served_model_name": SERVED, "replicas": [{"url": sim_url}]}],
        "keys": [{"id": k, "sha256": sha(KEYS[k]), "models": ["*"]} for k in keys],
        "timeouts": {"connect_s": 2, "first_byte_s": 30, "idle_s": 30},
        "health": {"active": False},
        "logging": {"access_log": False},
        "audit": {"store": f"sqlite://{tmp_path / 'audit.db'}",
                  "signing_key_file": str(tmp_path / "audit.key"),
                  "pseudonym_key_file": str(tmp_path / "pseudonym.key"), "replica_id": "gw1"},
        "flow_control": {"enabled": True, "default_class": "interactive",
                         "classes": [{"name": "interactive"}, {"name": "batch"}]},
        "batch": {"database": str(tmp_path / "batch.db"), "concurrency": concurrency},
    }, {})


def served(serve_asgi: Any, s: GatewaySettings) -> Any:
    return serve_asgi(create_app(s, assemble(s)))


def records(tmp_path: Path) -> list[dict[str, Any]]:
    """Every audit record's ``{"type": ..., **data}`` in chain order."""
    async def run() -> list[dict[str, Any]]:
        store = open_store(f"sqlite://{tmp_path / 'audit.db'}", read_only=True)
        await store.open()
        try:
            out: list[dict[str, Any]] = []
            after = 0
            while batch := await store.scan(after, 500):
                after = batch[-1][0]
                out.extend({"type": rec.type, **parse_body(rec.body)["data"]}
                           for _, rec in batch)
            return out
        finally:
            await store.close()
    return asyncio.run(run())


@pytest.mark.parametrize("line", [
    b'{"custom_id":"x","method":"POST","url":"/v1/chat/completions","body":{"model":"m","x":'
    + b"[" * 100_000 + b"]" * 100_000 + b"}}\n",
    b'{"custom_id":"x","method":"POST","url":"/v1/chat/completions","body":{"model":"m","x":'
    + b"[" * 200 + b"]" * 200 + b"}}\n",
    b'{"custom_id":"\\ud800","method":"POST","url":"/v1/chat/completions",'
    b'"body":{"model":"m","messages":[{"role":"user","content":"hi"}]}}\n',
    b'{"custom_id":"a","custom_id":"b","method":"POST","url":"/v1/chat/completions",'
    b'"body":{"model":"m","messages":[{"role":"user","content":"hi"}]}}\n',
    b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions",'
    b'"body":{"model":"m","model":"other","messages":[]}}\n',
    b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions",'
    b'"body":{"model":"m","temperature":NaN,"messages":[]}}\n',
], ids=["deep-nesting", "nesting-200", "lone-surrogate", "repeated-key", "repeated-model",
        "nan"])
def test_a_bad_input_line_is_a_400_naming_the_line_and_nothing_is_stored(
        serve_asgi: Any, tmp_path: Path, line: bytes) -> None:
    sim = start_sim(serve_asgi)
    url = str(serve_asgi(create_app(settings(sim.url, tmp_path / "batch.db",
                                             batch={"max_file_bytes": 1_000_000}))).url)
    c = client(url, "owner")
    f = c.files.create(file=("in.jsonl", io.BytesIO(jsonl(2) + line)), purpose="batch")
    with pytest.raises(openai.BadRequestError) as exc:
        c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                         completion_window="24h")
    assert exc.value.code == "invalid_jsonl"
    assert "line 3" in exc.value.message
    assert c.batches.list().data == []
    assert sim.stats()["received"] == 0


@pytest.mark.parametrize("metadata", ['{"k":"\\ud800"}', '{"k":"a","k":"b"}',
                                      '{"\\udc00":"v"}'])
def test_a_create_body_with_a_lone_surrogate_or_a_repeated_key_is_refused_before_storing(
        serve_asgi: Any, tmp_path: Path, metadata: str) -> None:
    sim = start_sim(serve_asgi)
    url = str(serve_asgi(create_app(settings(sim.url, tmp_path / "batch.db"))).url)
    c = client(url, "owner")
    f = c.files.create(file=("in.jsonl", io.BytesIO(jsonl(1))), purpose="batch")
    body = ('{"input_file_id":"' + f.id + '","endpoint":"/v1/chat/completions",'
            '"completion_window":"24h","metadata":' + metadata + '}')
    resp = httpx.post(url + "/v1/batches", content=body, timeout=30, headers={
        "authorization": f"Bearer {KEYS['owner']}", "content-type": "application/json"})
    assert resp.status_code == 400, resp.text
    assert "not valid JSON" in resp.json()["error"]["message"]
    assert c.batches.list().data == []  # and the key's listing still works
    time.sleep(0.3)
    assert sim.stats()["received"] == 0


def test_a_malformed_upload_names_the_multipart_problem(serve_asgi: Any,
                                                        tmp_path: Path) -> None:
    sim = start_sim(serve_asgi)
    url = str(serve_asgi(create_app(settings(sim.url, tmp_path / "batch.db"))).url)
    auth = {"authorization": f"Bearer {KEYS['owner']}"}
    bad = httpx.post(url + "/v1/files", content=b"--x\r\nnot a part", timeout=30, headers={
        **auth, "content-type": "multipart/form-data; boundary=x"})
    assert bad.status_code == 400
    err = bad.json()["error"]
    assert err["code"] == "invalid_multipart" and "multipart/form-data" in err["message"]
    no_purpose = httpx.post(url + "/v1/files", files={"file": ("a.jsonl", jsonl(1))},
                            timeout=30, headers=auth)
    assert no_purpose.status_code == 400
    assert "'purpose' must be 'batch' (missing)" in no_purpose.json()["error"]["message"]


def test_every_batch_change_is_in_the_audit_chain_and_its_requests_share_its_trace(
        serve_asgi: Any, tmp_path: Path) -> None:
    sim = start_sim(serve_asgi)
    gw = served(serve_asgi, audited(sim.url, tmp_path))
    c = client(str(gw.url), "owner")
    content = jsonl(3)
    b = submit(c, content)
    done = wait_batch(c, b.id, lambda b: b.status == "completed")
    assert done.request_counts.completed == 3
    c.files.delete(b.input_file_id)
    recs = records(tmp_path)
    by_type: dict[str, list[dict[str, Any]]] = {}
    for r in recs:
        by_type.setdefault(r["type"], []).append(r)
    [created_file] = [r for r in by_type["batch.file_created"] if r["purpose"] == "batch"]
    assert created_file["file_id"] == b.input_file_id and created_file["key_id"] == "owner"
    assert created_file["bytes"] == len(content)
    assert created_file["sha256"] == hashlib.sha256(content).hexdigest()
    trace = batch_trace_id(b.id)
    [created] = by_type["batch.created"]
    assert (created["batch_id"], created["requests"], created["trace_id"]) == (b.id, 3, trace)
    [finished] = by_type["batch.finished"]
    assert (finished["status"], finished["completed"], finished["failed"]) == (
        "completed", 3, 0)
    assert [r["file_id"] for r in by_type["batch.file_deleted"]] == [b.input_file_id]
    started = by_type["request.started"]
    assert len(started) == 3 and {r["trace_id"] for r in started} == {trace}
    # The record comes before the change it records is answered: created before the
    # batch's requests, finished after them.
    order = [r["type"] for r in recs]
    assert order.index("batch.created") < order.index("request.started")
    assert order.index("batch.finished") > max(i for i, t in enumerate(order)
                                               if t == "request.completed")


def test_a_line_refused_because_its_owner_was_removed_has_a_request_id_and_a_record(
        serve_asgi: Any, tmp_path: Path) -> None:
    sim = start_sim(serve_asgi, ttft_s=0.2)
    n = 6
    first = served(serve_asgi, audited(sim.url, tmp_path, concurrency=1))
    c = client(str(first.url), "owner")
    b = submit(c, jsonl(n))
    wait_batch(c, b.id, lambda b: b.request_counts.completed >= 1)
    first.stop()
    served(serve_asgi, audited(sim.url, tmp_path, keys=("other",), concurrency=1))
    deadline = time.monotonic() + 30
    while True:
        with sqlite3.connect(tmp_path / "batch.db") as con:
            status = con.execute("SELECT status FROM batches").fetchone()[0]
        if status == "completed":
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    errors = error_lines(tmp_path / "batch.db")
    assert errors and {e["error"]["code"] for e in errors} == {"key_revoked"}
    refused = {r["request_id"]: r for r in records(tmp_path)
               if r["type"] == "batch.request_refused"}
    for e in errors:
        rid = e["response"]["request_id"]
        assert len(rid) == 32, e
        rec = refused[rid]
        assert (rec["batch_id"], rec["custom_id"], rec["code"], rec["status"]) == (
            b.id, e["custom_id"], "key_revoked", 401)
        assert rec["trace_id"] == batch_trace_id(b.id)
    assert len(refused) == len(errors)
