"""Refusals of callers that established no principal are counted, not recorded one by one.

A tester wrote 6,200 durable ``request.denied`` records in 10 s from one client without a key
(13,555 guessing keys), each 401 waiting for its record's commit: with the store slow or
locked, 18 s of such requests got no answer at all. And one record per source address let 1,500
loopback addresses (what one IPv6 /64 gives anyone) write 1,500 ``http.refused`` records.
Driven through a real ``gateway serve`` with a SQLite chain (verified after each test): no-key
and bad-key requests on the relay and ``/v1/models`` routes become a few ``request.refused``
records whose counts add up, never holding the key; a known caller's refusal keeps its own
``request.denied``; the 401s are answered while the store is locked; and refusals from 100
addresses write at most ``CLIENTS_PER_INTERVAL`` records of their own plus one folded record.
"""

from __future__ import annotations

import socket
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from gateway.audit.refusals import CLIENTS_PER_INTERVAL
from tests.gateway.audit._served_audit import audited_gateway
from tests.gateway.gateway_server import read_until_closed, split_response
from tests.gateway.helpers import KEY_B, Sim
from tests.gateway.identity.jwtkit import SigningKey, identity_section, write_jwks

CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}]}


def _of_type(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r["data"] for r in records if r["type"] == kind]


def test_anonymous_refusals_are_counted_per_client_route_and_reason(
        sim: Sim, tmp_path: Path) -> None:
    with audited_gateway(sim, tmp_path, {}, "anonymous") as gw, httpx.Client(
            base_url=f"http://127.0.0.1:{gw.port}", timeout=10) as http:
        statuses: Counter[int] = Counter()
        for i in range(150):
            statuses[http.get("/v1/models").status_code] += 1
            statuses[http.get("/v1/models", headers={
                "authorization": f"Bearer sk-guess-{i:04d}"}).status_code] += 1
        for _ in range(100):
            statuses[http.post("/v1/chat/completions", json=CHAT).status_code] += 1
        for i in range(20):
            statuses[http.get(f"/v1/models/guess-{i}").status_code] += 1
        for i in range(10):  # a route of the app's own (not the relay's)
            statuses[http.get("/v1/usage", headers={
                "authorization": f"Bearer sk-guess-u{i}"}).status_code] += 1
        # A known caller's refusal is attributable: its own record, as before.
        denied = http.post("/v1/chat/completions", json=CHAT,
                           headers={"authorization": f"Bearer {KEY_B}"})
        assert statuses == {401: 430} and denied.status_code == 403
    refused = _of_type(gw.records, "request.refused")
    counts: Counter[tuple[str, str, str]] = Counter()
    for r in refused:
        assert (r["status"], r["decision"], r["interval_ms"]) == (401, "deny", 10_000)
        assert r["client"].startswith("hmac-sha256:")
        counts[r["error_code"], r["reason"], r["route_class"]] += r["count"]
    assert counts == {("invalid_api_key", "missing_credential", "/v1/models"): 150,
                      ("invalid_api_key", "unknown_key", "/v1/models"): 150,
                      ("invalid_api_key", "missing_credential", "/v1/chat/completions"): 100,
                      ("invalid_api_key", "missing_credential", "/v1/models/{id}"): 20,
                      ("invalid_api_key", "unknown_key", "/v1/usage"): 10}
    # One client: per kind, its first at once and the rest of each interval in one record.
    assert len(refused) <= 5 * 2 * 3, refused
    assert [(d["key_id"], d["status"], d["error_code"])
            for d in _of_type(gw.records, "request.denied")] == [
        ("team-b", 403, "model_not_allowed")]
    data = gw.db.read_bytes()
    assert b"sk-guess" not in data and b"guess-1" not in data and b"127.0.0.1" not in data


def test_anonymous_refusals_are_answered_while_the_store_is_locked(
        sim: Sim, tmp_path: Path) -> None:
    with audited_gateway(sim, tmp_path, {}, "locked", {"store_timeout_s": 10}) as gw:
        lock = sqlite3.connect(gw.db, isolation_level=None)
        try:
            lock.execute("BEGIN IMMEDIATE")  # the writer waits up to store_timeout_s
            t0 = time.monotonic()
            with httpx.Client(base_url=f"http://127.0.0.1:{gw.port}", timeout=3) as http:
                got = [http.get("/v1/models", headers={
                    "authorization": f"Bearer sk-guess-{i}"}).status_code for i in range(20)]
            elapsed = time.monotonic() - t0
        finally:
            lock.execute("ROLLBACK")
            lock.close()
        assert got == [401] * 20 and elapsed < 3, elapsed
    assert sum(r["count"] for r in _of_type(gw.records, "request.refused")) == 20


def test_refusals_from_many_addresses_fold_into_one_record(sim: Sim, tmp_path: Path) -> None:
    addresses = [f"127.0.9.{i}" for i in range(1, 101)]
    with audited_gateway(sim, tmp_path, {}, "addresses") as gw:
        for source in addresses:
            with socket.create_connection(
                    ("127.0.0.1", gw.port), timeout=5, source_address=(source, 0)) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n"
                             b"Content-Length: 2\r\n\r\n")
                data, closed = read_until_closed(sock)
                assert closed and split_response(data)[0] == 400
    refused = _of_type(gw.records, "http.refused")
    own = [r for r in refused if r["client"] is not None]
    folded = [r for r in refused if r["client"] is None]
    assert len(own) == CLIENTS_PER_INTERVAL and all(r["count"] == 1 for r in own)
    assert [(r["status"], r["error_code"], r["count"], r["clients"], r["clients_capped"])
            for r in folded] == [(400, "invalid_framing", 100 - CLIENTS_PER_INTERVAL,
                                  100 - CLIENTS_PER_INTERVAL, False)]


def test_refusals_tell_a_missing_credential_from_a_guessed_key_or_token(
        sim: Sim, tmp_path: Path) -> None:
    """``invalid_api_key`` answers both a client sending no key and one guessing keys: the
    body the SDKs see stays one, the ``request.refused`` records say which (``reason``), so
    a misconfigured client is told from someone guessing keys or forging tokens."""
    signer = SigningKey("k1")
    jwks = tmp_path / "jwks.json"
    identity = identity_section(jwks, write_jwks(jwks, signer))
    stranger = SigningKey("k1")  # the same kid, another key: a forged signature
    with audited_gateway(sim, tmp_path, {}, "reasons", sections={"identity": identity}) as gw, \
            httpx.Client(base_url=f"http://127.0.0.1:{gw.port}", timeout=10) as http:
        answers = []
        for i in range(3):
            answers.append(http.post("/v1/chat/completions", json=CHAT))
            answers.append(http.post("/v1/chat/completions", json=CHAT, headers={
                "authorization": f"Basic dXNlcjp{i}"}))  # another scheme: no bearer key
            answers.append(http.post("/v1/chat/completions", json=CHAT, headers={
                "authorization": f"Bearer sk-guess-{i}"}))
            answers.append(http.post("/v1/chat/completions", json=CHAT, headers={
                "authorization": f"Bearer {stranger.token()}"}))
            answers.append(http.post("/v1/chat/completions", json=CHAT, headers=[
                ("authorization", "Bearer sk-a"), ("authorization", "Bearer sk-b")]))
        usage = http.get("/v1/usage", headers=[  # a route of the app's own
            ("authorization", "Bearer sk-a"), ("authorization", "Bearer sk-b")])
        assert usage.status_code == 400
        ok = http.post("/v1/chat/completions", json=CHAT,
                       headers={"authorization": f"Bearer {signer.token()}"})
        assert ok.status_code == 200, ok.text
    missing, basic, guessed, forged, ambiguous = (answers[k::5] for k in range(5))
    # The answers are as before: one body for a missing and an unknown key.
    bodies = {r.content for r in missing + basic + guessed}
    assert len(bodies) == 1 and {r.status_code for r in missing + guessed} == {401}
    assert missing[0].json()["error"]["code"] == "invalid_api_key"
    assert {r.json()["error"]["code"] for r in forged} == {"token_signature_invalid"}
    assert {r.status_code for r in ambiguous} == {400}
    counts: Counter[tuple[int, str, str, str]] = Counter()
    for r in _of_type(gw.records, "request.refused"):
        counts[r["status"], r["error_code"], r["reason"], r["route_class"]] += r["count"]
    chat = "/v1/chat/completions"
    assert counts == {(401, "invalid_api_key", "missing_credential", chat): 6,
                      (401, "invalid_api_key", "unknown_key", chat): 3,
                      (401, "token_signature_invalid", "invalid_token", chat): 3,
                      (400, "ambiguous_credentials", "ambiguous_credentials", chat): 3,
                      (400, "ambiguous_credentials", "ambiguous_credentials", "/v1/usage"): 1}
