"""The Batch API through a real gateway (uvicorn on loopback, vLLM simulator, openai SDK).

Batch requests run in process through the relay (observed like any request, in the flow
control ``batch`` class); the job state is a real SQLite file, read back here to prove that a
restarted gateway resumes a batch without resending the requests already answered.
"""

from __future__ import annotations

import io
import json
import socket
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.app import create_app
from gateway.assembly import Gateway
from gateway.config.loader import parse
from gateway.config.settings import GatewaySettings
from tests.gateway.helpers import SERVED, Recorder, sha, start_sim

KEYS = {"owner": "sg-batch-owner-key", "other": "sg-batch-other-key"}


def settings(sim_url: str, db: Path, concurrency: int = 2, batch_lease_s: float = 30,
             keys: tuple[str, ...] = tuple(KEYS), batch: dict[str, Any] | None = None,
             **extra: Any) -> GatewaySettings:
    return parse({**extra,
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": "m", "served_model_name": SERVED, "replicas": [{"url": sim_url}]}],
        "keys": [{"id": k, "sha256": sha(KEYS[k]), "models": ["*"]} for k in keys],
        "timeouts": {"connect_s": 2, "first_byte_s": 30, "idle_s": 30},
        "health": {"active": False},
        "logging": {"access_log": False},
        "flow_control": {
            "enabled": True,
            "classes": [{"name": "interactive"}, {"name": "batch"}],
            "default_class": "interactive",
        },
        "batch": {"database": str(db), "concurrency": concurrency, "max_file_bytes": 4096,
                  "lease_s": batch_lease_s, **(batch or {})},
    }, {})


def jsonl(n: int, endpoint: str = "/v1/chat/completions") -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"req-{i}", "method": "POST", "url": endpoint,
        "body": {"model": "m", "max_tokens": 4,
                 "messages": [{"role": "user", "content": f"question {i}"}]},
    }).encode() + b"\n" for i in range(n))


def client(url: str, who: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEYS[who], max_retries=0, timeout=30)


def wait_batch(c: openai.OpenAI, batch_id: str, done: Callable[[Any], bool],
               timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        b = c.batches.retrieve(batch_id)
        if done(b):
            return b
        assert time.monotonic() < deadline, b
        time.sleep(0.05)


def error_lines(db: Path) -> list[dict[str, Any]]:
    """The error lines of the one batch in the SQLite file ``db``, read from its error file
    (an ended batch's request rows are removed: its answers are in its output files)."""
    with sqlite3.connect(db) as con:
        obj = json.loads(con.execute("SELECT object FROM batches").fetchone()[0])
        [(content,)] = con.execute("SELECT content FROM files WHERE id=?",
                                   (obj["error_file_id"],)).fetchall()
    return [json.loads(x) for x in bytes(content).decode().splitlines()]


def submit(c: openai.OpenAI, content: bytes) -> Any:
    f = c.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
    return c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                            completion_window="24h")


def test_sdk_batch_round_trip_runs_through_the_relay_in_the_batch_class(
        serve_asgi: Any, tmp_path: Path) -> None:
    sim = start_sim(serve_asgi)
    s = settings(sim.url, tmp_path / "batch.db")
    recorder = Recorder()
    url = str(serve_asgi(create_app(s, Gateway.of(s, observers=[recorder]))).url)
    c = client(url, "owner")
    f = c.files.create(file=("in.jsonl", io.BytesIO(jsonl(5))), purpose="batch")
    assert f.purpose == "batch" and f.bytes == len(jsonl(5))
    assert c.files.retrieve(f.id).filename == "in.jsonl"
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                         completion_window="24h", metadata={"job": "nightly"})
    assert b.request_counts is not None and b.request_counts.total == 5
    b = wait_batch(c, b.id, lambda b: b.status == "completed")
    assert b.request_counts.completed == 5 and b.request_counts.failed == 0
    assert b.metadata == {"job": "nightly"} and b.error_file_id is None
    lines = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
    assert [x["custom_id"] for x in lines] == [f"req-{i}" for i in range(5)]
    for x in lines:
        assert x["error"] is None and x["response"]["status_code"] == 200
        assert x["response"]["body"]["choices"][0]["message"]["content"]
    # The five requests went through the observers (audit seam) as the owner's key.
    ended = list(recorder.wait(5))
    assert {r.key_id for r in ended} == {"owner"}
    assert {r.path for r in ended} == {"/v1/chat/completions"}
    assert {r.flow["class"] for r in ended if r.flow} == {"batch"}  # not the key's interactive
    assert all(r.flow for r in ended)
    # An interactive request of the same key is still in its own class.
    c.chat.completions.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "x"}])
    assert recorder.wait(6)[-1].flow["class"] == "interactive"
    assert {x["response"]["request_id"] for x in lines} == {r.request_id for r in ended}
    assert sim.stats()["received"] == 6
    assert [x.id for x in c.batches.list().data] == [b.id]


def test_another_key_sees_neither_the_batch_nor_its_files(serve_asgi: Any,
                                                          tmp_path: Path) -> None:
    sim = start_sim(serve_asgi)
    url = str(serve_asgi(create_app(settings(sim.url, tmp_path / "batch.db"))).url)
    owner, other = client(url, "owner"), client(url, "other")
    b = submit(owner, jsonl(2))
    b = wait_batch(owner, b.id, lambda b: b.status == "completed")
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(b.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(b.output_file_id)
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(b.input_file_id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(b.id)
    with pytest.raises(openai.NotFoundError):  # nor start a batch from another key's file
        other.batches.create(input_file_id=b.input_file_id, endpoint="/v1/chat/completions",
                             completion_window="24h")
    assert other.batches.list().data == []
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="sg-nope", max_retries=0).batches.list()


def test_bad_input_is_refused_naming_the_line_and_the_limit(serve_asgi: Any,
                                                           tmp_path: Path) -> None:
    sim = start_sim(serve_asgi)
    url = str(serve_asgi(create_app(settings(sim.url, tmp_path / "batch.db"))).url)
    c = client(url, "owner")
    bad = jsonl(1) + b"{not json\n"
    f = c.files.create(file=("bad.jsonl", io.BytesIO(bad)), purpose="batch")
    with pytest.raises(openai.BadRequestError) as exc:
        c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                         completion_window="24h")
    assert exc.value.code == "invalid_jsonl" and "line 2" in exc.value.message
    dup = jsonl(2).replace(b"req-1", b"req-0")
    f = c.files.create(file=("dup.jsonl", io.BytesIO(dup)), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="line 2: 'custom_id' 'req-0'"):
        c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                         completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="line 1: 'url'"):
        f = c.files.create(file=("e.jsonl", io.BytesIO(jsonl(1, "/v1/embeddings"))),
                           purpose="batch")
        c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                         completion_window="24h")
    with pytest.raises(openai.APIStatusError) as too_big:
        c.files.create(file=("big.jsonl", io.BytesIO(jsonl(60))), purpose="batch")
    assert too_big.value.status_code == 413 and too_big.value.code == "file_too_large"
    with pytest.raises(openai.BadRequestError, match="'purpose' must be 'batch'"):
        c.files.create(file=("in.jsonl", io.BytesIO(jsonl(1))), purpose="assistants")
    assert sim.stats()["received"] == 0


def test_cancel_stops_sending_and_keeps_the_answers_so_far(serve_asgi: Any,
                                                          tmp_path: Path) -> None:
    sim = start_sim(serve_asgi, ttft_s=0.2)
    url = str(serve_asgi(create_app(settings(sim.url, tmp_path / "batch.db", 1))).url)
    c = client(url, "owner")
    b = submit(c, jsonl(20))
    wait_batch(c, b.id, lambda b: b.request_counts.completed >= 1)
    assert c.batches.cancel(b.id).status == "cancelling"
    b = wait_batch(c, b.id, lambda b: b.status == "cancelled")
    done = b.request_counts.completed
    assert 1 <= done < 20 and b.cancelled_at is not None
    assert len(c.files.content(b.output_file_id).text.splitlines()) == done
    assert sim.stats()["received"] == done
    with pytest.raises(openai.ConflictError):
        c.batches.cancel(b.id)


def test_a_restarted_gateway_resumes_without_resending_answered_requests(
        serve_asgi: Any, tmp_path: Path) -> None:
    sim = start_sim(serve_asgi, ttft_s=0.2)
    db = tmp_path / "batch.db"
    n = 12
    first = serve_asgi(create_app(settings(sim.url, db, 1)))
    c = client(str(first.url), "owner")
    b = submit(c, jsonl(n))
    wait_batch(c, b.id, lambda b: b.request_counts.completed >= 3)
    first.stop()
    with sqlite3.connect(db) as con:
        answered = con.execute("SELECT count(*) FROM requests WHERE done=1").fetchone()[0]
    received_before = sim.stats()["received"]
    assert 3 <= answered < n and answered <= received_before <= answered + 1
    second = serve_asgi(create_app(settings(sim.url, db, 1)))
    c = client(str(second.url), "owner")
    b = wait_batch(c, b.id, lambda b: b.status == "completed")
    assert b.request_counts.completed == n
    # Exactly the unanswered requests were sent again (none of the answered ones).
    assert sim.stats()["received"] == received_before + (n - answered)
    lines = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
    assert [x["custom_id"] for x in lines] == [f"req-{i}" for i in range(n)]


def test_busy_answers_are_retried_and_other_errors_become_error_lines(
        serve_asgi: Any, tmp_path: Path) -> None:
    sim = start_sim(serve_asgi)
    # The relay does not retry (one attempt): the 429 reaches the batch runner, which waits.
    s = settings(sim.url, tmp_path / "batch.db", 1, retries={"max_attempts": 1})
    url = str(serve_asgi(create_app(s)).url)
    c = client(url, "owner")
    sim.fault(mode="status_429", retry_after_s=0, count=2)  # a busy replica, twice
    content = jsonl(2) + json.dumps({
        "custom_id": "no-such-model", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "nope", "messages": [{"role": "user", "content": "x"}]}}).encode()
    b = submit(c, content)
    b = wait_batch(c, b.id, lambda b: b.status == "completed")
    assert (b.request_counts.completed, b.request_counts.failed) == (2, 1)
    assert sim.stats()["received"] == 4  # two 429s, then the two requests answered
    ok = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
    assert [x["custom_id"] for x in ok] == ["req-0", "req-1"]
    [err] = [json.loads(x) for x in c.files.content(b.error_file_id).text.splitlines()]
    assert err["custom_id"] == "no-such-model" and err["response"]["status_code"] == 404
    assert err["error"]["code"] == "model_not_found" and "nope" in err["error"]["message"]


def test_the_store_is_the_postgres_audit_database_or_batch_db_next_to_sqlite(
        tmp_path: Path) -> None:
    from gateway.batch.settings import BatchSettings, store_location
    from gateway.errors import ConfigError

    audit = f"sqlite://{tmp_path}/audit/audit.db"
    assert store_location(BatchSettings(), audit) == tmp_path / "audit" / "batch.db"
    named = BatchSettings(database=tmp_path / "jobs.db")
    assert store_location(named, audit) == tmp_path / "jobs.db"
    pg = "postgresql://u@127.0.0.1/db"
    assert store_location(BatchSettings(), pg) == pg  # same DSN, its own sg_batch_* tables
    assert store_location(named, pg) == tmp_path / "jobs.db"
    with pytest.raises(ConfigError, match=r"batch\.database: not set"):
        store_location(BatchSettings(), None)


def test_uploads_are_bounded_before_the_body_is_read_and_listing_pages(
        serve_asgi: Any, tmp_path: Path) -> None:
    import httpx

    sim = start_sim(serve_asgi)
    url = str(serve_asgi(create_app(settings(sim.url, tmp_path / "batch.db"))).url)
    auth = {"authorization": f"Bearer {KEYS['owner']}"}

    def chunks() -> Any:
        yield b"--x\r\n"

    with httpx.Client(timeout=10) as h:
        r = h.post(url + "/v1/files", headers={**auth, "content-type":
                                               "multipart/form-data; boundary=x"},
                   content=chunks())  # chunked: no Content-Length
        assert r.status_code == 411 and r.json()["error"]["code"] == "length_required"
    # A declared size over the limit is refused from the headers alone (no body sent).
    host, port = url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/files HTTP/1.1\r\nhost: x\r\n"
                     + f"authorization: Bearer {KEYS['owner']}\r\n".encode()
                     + b"content-type: multipart/form-data; boundary=x\r\n"
                     b"content-length: 1000000000\r\n\r\n")
        answer = b""
        while b"}}" not in answer:
            got = sock.recv(65536)
            assert got, answer
            answer += got
    assert answer.startswith(b"HTTP/1.1 413") and b"batch.max_file_bytes" in answer
    c = client(url, "owner")
    ids = [submit(c, jsonl(1)).id for _ in range(3)]
    first = c.batches.list(limit=2)
    assert first.has_more and len(first.data) == 2
    second = c.batches.list(limit=2, after=first.data[-1].id)
    assert not second.has_more
    assert sorted(b.id for b in [*first.data, *second.data]) == sorted(ids)


def test_two_gateways_on_one_database_run_a_batch_once(serve_asgi: Any,
                                                       tmp_path: Path) -> None:
    # Like `gateway serve --workers 2`: both processes resume unfinished batches at start-up
    # and every lease_s; the lease lets only one of them run a batch.
    sim = start_sim(serve_asgi, ttft_s=0.05)
    db = tmp_path / "batch.db"
    n = 10
    a = str(serve_asgi(create_app(settings(sim.url, db, 1, batch_lease_s=1))).url)
    b = submit(client(a, "owner"), jsonl(n))
    other = client(str(serve_asgi(create_app(settings(sim.url, db, 1,
                                                      batch_lease_s=1))).url), "owner")
    done = wait_batch(other, b.id, lambda b: b.status == "completed")  # read through B
    assert done.request_counts.completed == n
    assert sim.stats()["received"] == n  # not 2n: B never ran it while A held the lease


def test_a_batch_of_a_key_removed_before_the_restart_sends_nothing_more(
        serve_asgi: Any, tmp_path: Path) -> None:
    sim = start_sim(serve_asgi, ttft_s=0.2)
    db = tmp_path / "batch.db"
    n = 8
    first = serve_asgi(create_app(settings(sim.url, db, 1)))
    b = submit(client(str(first.url), "owner"), jsonl(n))
    wait_batch(client(str(first.url), "owner"), b.id, lambda b: b.request_counts.completed >= 2)
    first.stop()
    received = sim.stats()["received"]
    with sqlite3.connect(db) as con:
        answered = con.execute("SELECT count(*) FROM requests WHERE done=1").fetchone()[0]
    # Restarted with the owner's key removed from the config (revoked).
    serve_asgi(create_app(settings(sim.url, db, 1, keys=("other",))))
    deadline = time.monotonic() + 30
    while True:
        with sqlite3.connect(db) as con:
            status = con.execute("SELECT status FROM batches").fetchone()[0]
        if status == "completed":
            break
        assert time.monotonic() < deadline, status
        time.sleep(0.05)
    assert sim.stats()["received"] == received  # nothing more sent for the revoked key
    errors = error_lines(db)
    assert len(errors) == n - answered
    assert {e["error"]["code"] for e in errors} == {"key_revoked"}


def test_check_config_names_a_missing_batch_database(tmp_path: Path) -> None:
    from gateway.config.loader import load
    from gateway.errors import ConfigError

    cfg = tmp_path / "gw.yaml"
    cfg.write_text("models: [{name: m, replicas: [{url: 'http://127.0.0.1:9'}]}]\n"
                   "batch: {concurrency: 2}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"batch\.database: not set"):
        load(cfg, {})
    cfg.write_text("models: [{name: m, replicas: [{url: 'http://127.0.0.1:9'}]}]\n"
                   "audit: {store: 'postgresql://u@127.0.0.1:5432/db'}\n"
                   "batch: {concurrency: 2}\n", encoding="utf-8")
    load(cfg, {})  # the PostgreSQL audit database holds the batches
    cfg.write_text("models: [{name: m, replicas: [{url: 'http://127.0.0.1:9'}]}]\n"
                   "audit: {store: 'sqlite://audit/audit.db'}\nbatch: {}\n", encoding="utf-8")
    s = load(cfg, {})
    from gateway.batch.settings import audit_store_url, store_location

    assert s.batch is not None
    assert store_location(s.batch, audit_store_url(s.audit)) == tmp_path / "audit" / "batch.db"


def _raw_post(url: str, path: str, head: bytes) -> bytes:
    """Send a request head only (no body) and read the answer until its JSON ends."""
    host, port = url.rsplit("/", 1)[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nhost: x\r\n".encode() + head + b"\r\n")
        answer = b""
        while b"}}" not in answer:
            got = sock.recv(65536)
            assert got, answer
            answer += got
    return answer


def test_a_batch_create_request_is_bounded_and_its_metadata_checked(
        serve_asgi: Any, tmp_path: Path) -> None:
    """``POST /v1/batches`` carries a few ids and at most 16 metadata pairs (OpenAI: keys up to
    64 characters, string values up to 512): a body announced at 1 GB is refused from its head
    (not read into memory), and metadata beyond OpenAI's limits is refused, not stored."""
    sim = start_sim(serve_asgi)
    url = str(serve_asgi(create_app(settings(sim.url, tmp_path / "batch.db"))).url)
    answer = _raw_post(url, "/v1/batches", f"authorization: Bearer {KEYS['owner']}\r\n".encode()
                       + b"content-type: application/json\r\ncontent-length: 1000000000\r\n")
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    c = client(url, "owner")
    f = c.files.create(file=("in.jsonl", io.BytesIO(jsonl(1))), purpose="batch")
    for metadata in ({f"k{i}": "v" for i in range(17)}, {"k": "v" * 513}, {"k" * 65: "v"},
                     {"k": {"nested": "object"}}):
        with pytest.raises(openai.BadRequestError) as info:
            c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                             completion_window="24h", metadata=metadata)  # type: ignore[arg-type]
        assert info.value.param == "metadata"  # type: ignore[attr-defined]
    assert c.batches.list().data == []


def test_a_key_deletes_its_own_files_and_not_another_keys(serve_asgi: Any,
                                                          tmp_path: Path) -> None:
    """The OpenAI SDK's ``files.delete``: the owner's upload is gone afterwards (404), another
    key's delete answers 404 and leaves the file in place."""
    sim = start_sim(serve_asgi)
    url = str(serve_asgi(create_app(settings(sim.url, tmp_path / "batch.db"))).url)
    with client(url, "owner") as owner, client(url, "other") as other:
        f = owner.files.create(file=("in.jsonl", io.BytesIO(jsonl(1))), purpose="batch")
        with pytest.raises(openai.NotFoundError):
            other.files.delete(f.id)
        assert owner.files.retrieve(f.id).id == f.id
        gone = owner.files.delete(f.id)
        assert gone.deleted and gone.id == f.id
        with pytest.raises(openai.NotFoundError):
            owner.files.content(f.id)
    with sqlite3.connect(tmp_path / "batch.db") as con:
        assert con.execute("SELECT count(*) FROM files").fetchone()[0] == 0


def quota_settings(big: bytes, small: bytes) -> dict[str, Any]:
    """Per-owner limits that hold two ``big`` files and one ``small`` one, three files in all."""
    return {"max_stored_bytes_per_owner": 2 * len(big) + len(small), "max_files_per_owner": 3}


def check_owner_quota(url: str, big: bytes, small: bytes) -> list[str]:
    """Fill the owner's quota (:func:`quota_settings`) through the OpenAI SDK, check the
    refusals (413, the limit and the usage named, nothing stored) and that a delete frees
    room. Returns the owner's stored file ids."""
    def upload(c: openai.OpenAI, content: bytes) -> Any:
        return c.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")

    with client(url, "owner") as owner, client(url, "other") as other:
        first, second = upload(owner, big), upload(owner, big)
        with pytest.raises(openai.APIStatusError) as refused:
            upload(owner, big)
        err = refused.value
        assert err.status_code == 413 and err.code == "storage_quota_exceeded"
        assert "batch.max_stored_bytes_per_owner" in err.message
        assert f"already stores {2 * len(big)} bytes in 2 files" in err.message
        assert upload(other, big).id  # the limit is per owner
        third = upload(owner, small)  # exactly at the byte limit: accepted
        with pytest.raises(openai.APIStatusError) as refused:
            upload(owner, b"")
        err = refused.value
        assert err.status_code == 413 and err.code == "file_count_quota_exceeded"
        assert "batch.max_files_per_owner" in err.message and "3 files" in err.message
        assert [owner.files.retrieve(f.id).bytes for f in (first, second, third)] == [
            len(big), len(big), len(small)]
        assert owner.files.delete(first.id).deleted  # frees its bytes and its slot
        fourth = upload(owner, big)
        return sorted([second.id, third.id, fourth.id])


def check_concurrent_uploads(url: str, n: int = 8) -> None:
    """``n`` uploads at once against ``max_files_per_owner: 3``: exactly 3 are stored (the
    usage is read and the file stored in one transaction, serialised per owner)."""
    from concurrent.futures import ThreadPoolExecutor

    def upload(i: int) -> int:
        with client(url, "owner") as c:
            try:
                c.files.create(file=("in.jsonl", io.BytesIO(jsonl(1))), purpose="batch")
            except openai.APIStatusError as exc:
                assert exc.code == "file_count_quota_exceeded", exc
                return exc.status_code
            return 200

    with ThreadPoolExecutor(n) as pool:
        statuses = sorted(pool.map(upload, range(n)))
    assert statuses == [200] * 3 + [413] * (n - 3)


def test_concurrent_uploads_do_not_slip_past_the_per_owner_limit(
        serve_asgi: Any, tmp_path: Path) -> None:
    sim = start_sim(serve_asgi)
    s = settings(sim.url, tmp_path / "batch.db", batch={"max_files_per_owner": 3})
    check_concurrent_uploads(str(serve_asgi(create_app(s)).url))
    with sqlite3.connect(tmp_path / "batch.db") as con:
        assert con.execute("SELECT count(*) FROM files").fetchone()[0] == 3


def test_stored_files_are_bounded_per_owner_and_a_delete_frees_room(
        serve_asgi: Any, tmp_path: Path) -> None:
    sim = start_sim(serve_asgi)
    big, small = jsonl(3), jsonl(1)
    s = settings(sim.url, tmp_path / "batch.db", batch=quota_settings(big, small))
    ids = check_owner_quota(str(serve_asgi(create_app(s)).url), big, small)
    with sqlite3.connect(tmp_path / "batch.db") as con:
        rows = con.execute("SELECT id FROM files WHERE owner='owner' ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ids


def test_checking_a_large_input_file_does_not_stall_other_requests(
        serve_asgi: Any, tmp_path: Path) -> None:
    """Creating a batch parses its whole input file (up to ``max_file_bytes``, 100 MB by
    default: about 11 s of CPU on a loaded 2-core machine). That work must not hold the event
    loop: other requests of the same process are answered meanwhile."""
    import threading

    import httpx

    sim = start_sim(serve_asgi)
    s = settings(sim.url, tmp_path / "batch.db")
    s = s.model_copy(update={"batch": s.batch.model_copy(  # type: ignore[union-attr]
        update={"max_file_bytes": 40_000_000, "max_requests": 50_000})})
    url = str(serve_asgi(create_app(s)).url)
    line = {"custom_id": "", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "max_tokens": 1,
                     "messages": [{"role": "user", "content": "a" * 1900}]}}
    content = b"".join(json.dumps({**line, "custom_id": f"r{i}"}).encode() + b"\n"
                       for i in range(18_000))
    with client(url, "owner") as c:
        f = c.files.create(file=("big.jsonl", io.BytesIO(content)), purpose="batch")
        c.batches.list()  # warm: the next call's time is the create's own
        created: list[Any] = []
        worker = threading.Thread(target=lambda: created.append(c.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")))
        slowest = 0.0
        with httpx.Client(timeout=60) as h:
            worker.start()
            while worker.is_alive():
                start = time.monotonic()
                assert h.get(url + "/healthz").status_code == 200
                slowest = max(slowest, time.monotonic() - start)
            worker.join()
        c.batches.cancel(created[0].id)
    assert slowest < 1.0, f"/healthz waited {slowest:.2f} s behind the batch's file check"
