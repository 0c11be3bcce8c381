"""``GET /v1/models`` and ``/v1/models/{id}`` are keyed requests: each one is in the audit log.

A wrong key tried against ``/v1/models`` must be in the log just as it is on
``/v1/chat/completions`` (otherwise key guessing there is invisible to the log): counted in a
``request.refused`` record, as every refusal of a caller not established is; a known key's
refusal has its own ``request.denied``; and a listing is disclosed only once its
``request.started`` record is durable. Real uvicorn on
loopback, the official ``openai`` SDK, SQLite and PostgreSQL stores.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from _audit_helpers import verify

from gateway.app import create_app
from gateway.audit import AuditSettings, Signer
from gateway.audit.backends import open_store
from gateway.audit.observer import build
from tests.gateway.audit.test_audit_gateway import audit_section, records_of
from tests.gateway.helpers import KEY_A, Sim, settings


@pytest.fixture
def audited(
    serve_asgi: Callable[..., Any], sim: Sim, tmp_path: Path, store_url: str, signer: Signer
) -> Iterator[tuple[str, Any]]:
    observer = build(AuditSettings.model_validate(
        audit_section(tmp_path, store_url, signer, store_timeout_s=0.3)))
    assert observer is not None
    srv = serve_asgi(create_app(settings([sim.url]), observers=[observer]))
    yield srv.url, srv


def _only(store_url: str, request_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(r.type, r.decoded()["data"]) for r in records_of(store_url, request_id)]


def _counted_refusals(store_url: str) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        store = open_store(store_url, read_only=True)
        await store.open()
        try:
            rows = await store.scan(0, 10_000)
        finally:
            await store.close()
        return [r.decoded()["data"] for _, r in rows if r.type == "request.refused"]

    return asyncio.run(run())


def test_every_models_request_is_audited_refusals_included(
    audited: tuple[str, Any], store_url: str, signer: Signer, sim: Sim
) -> None:
    url, srv = audited
    with openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0) as client:
        listed = client.models.with_raw_response.list()
        assert [m.id for m in listed.parse()] == ["llama-3.1-8b"]
        got = client.models.with_raw_response.retrieve("default")
        assert got.parse().id == "llama-3.1-8b"
        with pytest.raises(openai.NotFoundError) as unknown:
            client.models.retrieve("no-such-model")
    with openai.OpenAI(base_url=url + "/v1", api_key="sg-guessed", max_retries=0) as guesser:
        with pytest.raises(openai.AuthenticationError) as bad_key:
            guesser.models.list()
    wrong_method = httpx.post(url + "/v1/models", headers={"Authorization": f"Bearer {KEY_A}"})
    assert wrong_method.status_code == 405
    srv.stop()  # closes the chain with a final signed checkpoint

    started, done = _only(store_url, listed.headers["x-request-id"])
    assert (started[0], done[0]) == ("request.started", "request.completed")
    assert started[1]["key_id"] == "team-a" and started[1]["path"] == "/v1/models"
    assert started[1]["method"] == "GET" and started[1]["client"].startswith("hmac-sha256:")
    assert (done[1]["status"], done[1]["outcome"]) == (200, "ok")
    assert done[1]["bytes_out"] == len(listed.http_response.content)

    started, done = _only(store_url, got.headers["x-request-id"])
    assert started[1]["path"] == "/v1/models/default"
    assert (started[1]["model"], started[1]["canonical_model"]) == ("default", "llama-3.1-8b")
    assert done[1]["status"] == 200

    [(kind, data)] = _only(store_url, unknown.value.response.headers["x-request-id"])
    assert kind == "request.denied" and data["key_id"] == "team-a"
    assert (data["status"], data["error_code"]) == (404, "model_not_found")

    # No caller was established: counted per client, route and reason, no record of its own.
    assert _only(store_url, bad_key.value.response.headers["x-request-id"]) == []
    assert _only(store_url, wrong_method.headers["x-request-id"]) == []
    counted = [(d["status"], d["error_code"], d["route_class"], d["count"], d["decision"])
               for d in _counted_refusals(store_url)]
    assert counted == [(401, "invalid_api_key", "/v1/models", 1, "deny"),
                       (405, "method_not_allowed", "/v1/models", 1, "deny")]

    report = verify(store_url, signer)
    assert report.ok and [f.code for f in report.findings] == [], [str(f) for f in report.errors]
    assert sim.stats()["received"] == 0  # nothing of this reaches a backend


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_models_listing_is_not_disclosed_while_the_audit_store_is_down(
    audited: tuple[str, Any], store_url: str
) -> None:
    url, _ = audited
    auth = {"Authorization": f"Bearer {KEY_A}"}
    assert httpx.get(url + "/v1/models", headers=auth).status_code == 200
    lock = sqlite3.connect(store_url[len("sqlite://"):], isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        r = httpx.get(url + "/v1/models", headers=auth, timeout=10)
        assert r.status_code == 503 and r.json()["error"]["code"] == "audit_unavailable"
        assert "llama-3.1-8b" not in r.text
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert httpx.get(url + "/v1/models", headers=auth).status_code == 200
