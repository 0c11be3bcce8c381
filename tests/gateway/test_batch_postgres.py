"""The Batch API with the PostgreSQL audit store: batches live in the audit database.

A real gateway (uvicorn on loopback) with ``audit.store: postgresql://...`` and a ``batch``
section without ``batch.database``; the official ``openai`` SDK submits a batch; the gateway is
stopped mid-batch and a new one started on the same database resumes it. The tables are read
back with asyncpg, and the audit records of the same database are counted against the
simulator's: no request is sent twice.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import asyncpg
import openai
import pytest

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.audit import Signer, generate_key_file, open_store, write_key_pair
from gateway.audit.records import parse_body
from gateway.config.loader import parse
from gateway.config.settings import GatewaySettings
from tests.gateway.helpers import SERVED, sha, start_sim
from tests.gateway.test_batch_api import (
    KEYS,
    check_concurrent_uploads,
    check_owner_quota,
    client,
    jsonl,
    quota_settings,
    submit,
    wait_batch,
)
from tests.gateway.test_batch_limits import check_batch_storage, storage_settings


def served(serve_asgi: Any, s: GatewaySettings) -> Any:
    """The gateway as ``gateway serve`` assembles it (the audit log from the settings)."""
    return serve_asgi(create_app(s, assemble(s)))


def pg_settings(sim_url: str, dsn: str, tmp_path: Path,
                batch: dict[str, Any] | None = None) -> GatewaySettings:
    if not (tmp_path / "audit.key").exists():
        write_key_pair(Signer.generate(), tmp_path / "audit.key")
        generate_key_file(tmp_path / "pseudonym.key")
    return parse({
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": "m", "served_model_name": SERVED, "replicas": [{"url": sim_url}]}],
        "keys": [{"id": k, "sha256": sha(v), "models": ["*"]} for k, v in KEYS.items()],
        "timeouts": {"connect_s": 2, "first_byte_s": 30, "idle_s": 30},
        "health": {"active": False},
        "logging": {"access_log": False},
        "audit": {"store": dsn, "signing_key_file": str(tmp_path / "audit.key"),
                  "pseudonym_key_file": str(tmp_path / "pseudonym.key"), "replica_id": "gw1"},
        "flow_control": {"enabled": True, "default_class": "interactive",
                         "classes": [{"name": "interactive"}, {"name": "batch"}]},
        "batch": {"concurrency": 1, **(batch or {})},
    }, {})


def query(dsn: str, sql: str) -> list[Any]:
    async def run() -> list[Any]:
        conn = await asyncpg.connect(dsn)
        try:
            return [tuple(r) for r in await conn.fetch(sql)]
        finally:
            await conn.close()
    return asyncio.run(run())


def started_request_ids(dsn: str) -> list[str]:
    """``request_id`` of every ``request.started`` audit record in the database."""
    async def run() -> list[str]:
        store = open_store(dsn, read_only=True)
        await store.open()
        try:
            found: list[str] = []
            after = 0
            while batch := await store.scan(after, 500):
                after = batch[-1][0]
                found.extend(str(parse_body(rec.body)["data"]["request_id"])
                             for _, rec in batch if rec.type == "request.started")
            return found
        finally:
            await store.close()
    return asyncio.run(run())


def test_a_batch_in_the_postgres_audit_database_resumes_after_a_restart(
        serve_asgi: Any, tmp_path: Path, pg_database: str) -> None:
    sim = start_sim(serve_asgi, ttft_s=0.2)
    n = 10
    first = served(serve_asgi, pg_settings(sim.url, pg_database, tmp_path))
    c = client(str(first.url), "owner")
    b = submit(c, jsonl(n))
    wait_batch(c, b.id, lambda b: b.request_counts.completed >= 3)
    first.stop()
    [(answered,)] = query(pg_database,
                          "SELECT count(*) FROM sg_batch_requests WHERE done")
    [(status, lease)] = query(pg_database, "SELECT status, lease_owner FROM sg_batch_batches")
    assert status == "in_progress" and lease is None  # a clean stop gave the lease up
    received_before = sim.stats()["received"]
    assert 3 <= answered < n and answered <= received_before <= answered + 1
    second = served(serve_asgi, pg_settings(sim.url, pg_database, tmp_path))
    c = client(str(second.url), "owner")
    b = wait_batch(c, b.id, lambda b: b.status == "completed")
    assert (b.request_counts.completed, b.request_counts.failed) == (n, 0)
    # Only the unanswered requests were sent again.
    assert sim.stats()["received"] == received_before + (n - answered)
    lines = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
    assert [x["custom_id"] for x in lines] == [f"req-{i}" for i in range(n)]
    for x in lines:
        assert x["response"]["status_code"] == 200 and x["error"] is None
        assert x["response"]["body"]["choices"][0]["message"]["content"]
    # The audit log (same database) saw each request the simulator received exactly once,
    # and every output line names an audited request. The stop may have caught one request
    # after its record and before it was sent: audited, never received, sent again after.
    audited = started_request_ids(pg_database)
    received = [h["headers"]["x-request-id"] for h in sim.stats()["history"]
                if h["path"] == "/v1/chat/completions"]
    assert len(received) == len(set(received)) == sim.stats()["received"]
    assert len(audited) == len(set(audited))
    assert set(received) <= set(audited)
    assert len(audited) - len(received) <= 1, (audited, received)
    assert {x["response"]["request_id"] for x in lines} <= set(received)
    # The files are in the database too (the input, and the output made at the end).
    files = query(pg_database, "SELECT purpose, owner FROM sg_batch_files ORDER BY created_at")
    assert sorted(files) == [("batch", "owner"), ("batch_output", "owner")]


def test_a_file_is_deleted_by_its_owner_only_in_postgres(
        serve_asgi: Any, tmp_path: Path, pg_database: str) -> None:
    sim = start_sim(serve_asgi)
    gw = served(serve_asgi, pg_settings(sim.url, pg_database, tmp_path))
    with client(str(gw.url), "owner") as owner, client(str(gw.url), "other") as other:
        f = owner.files.create(file=("in.jsonl", io.BytesIO(jsonl(1))), purpose="batch")
        with pytest.raises(openai.NotFoundError):
            other.files.delete(f.id)
        assert owner.files.delete(f.id).deleted
        with pytest.raises(openai.NotFoundError):
            owner.files.delete(f.id)
    assert query(pg_database, "SELECT count(*) FROM sg_batch_files") == [(0,)]


def test_stored_files_are_bounded_per_owner_in_postgres(
        serve_asgi: Any, tmp_path: Path, pg_database: str) -> None:
    sim = start_sim(serve_asgi)
    big, small = jsonl(3), jsonl(1)
    gw = served(serve_asgi, pg_settings(sim.url, pg_database, tmp_path,
                                        batch=quota_settings(big, small)))
    ids = check_owner_quota(str(gw.url), big, small)
    rows = query(pg_database, "SELECT id FROM sg_batch_files WHERE owner='owner' ORDER BY id")
    assert [r[0] for r in rows] == ids


def test_concurrent_uploads_do_not_slip_past_the_per_owner_limit_in_postgres(
        serve_asgi: Any, tmp_path: Path, pg_database: str) -> None:
    sim = start_sim(serve_asgi)
    gw = served(serve_asgi, pg_settings(sim.url, pg_database, tmp_path,
                                        batch={"max_files_per_owner": 3}))
    check_concurrent_uploads(str(gw.url))
    assert query(pg_database, "SELECT count(*) FROM sg_batch_files") == [(3,)]


def test_a_batch_counts_toward_its_owners_storage_in_postgres(
        serve_asgi: Any, tmp_path: Path, pg_database: str) -> None:
    sim = start_sim(serve_asgi, ttft_s=0.2)
    content = jsonl(6)
    gw = served(serve_asgi, pg_settings(sim.url, pg_database, tmp_path,
                                        batch=storage_settings(content)))
    check_batch_storage(str(gw.url), content, lambda: int(
        query(pg_database, "SELECT count(*) FROM sg_batch_requests")[0][0]))
