"""What one key's batches may take from the others: storage and the runner's slots.

Through a real gateway (uvicorn on loopback, the vLLM simulator, the official openai SDK, a
real SQLite file), as ``test_batch_api.py``:

* a batch's request rows are a copy of its input file: they count toward the owner's
  ``max_stored_bytes_per_owner`` / ``max_files_per_owner`` (a batch is refused 413 without
  room), and they are removed when the batch ends (its answers are in its output files);
* an answer that says it cannot succeed (``x-should-retry: false``, ``request_too_large``, a
  ``retry-after`` beyond ``retry_max_wait_s``) is not sent again;
* a key whose requests wait to be retried does not hold the pod's batch slots: another key's
  batch runs meanwhile (slots are handed round-robin between owners).
"""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.batch.jsonl import parse_input
from gateway.batch.slots import FairSlots
from tests.gateway.helpers import start_sim
from tests.gateway.test_batch_api import client, jsonl, settings, submit, wait_batch

ENDPOINT = "/v1/chat/completions"


def _rows(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return int(con.execute("SELECT count(*) FROM requests").fetchone()[0])


def storage_settings(content: bytes) -> dict[str, Any]:
    """Per-owner limits with room for ``content`` uploaded and one batch's copy of it (its
    request bodies), not two; three files."""
    rows = sum(len(body) for _, _, body in parse_input(content, ENDPOINT, 100))
    return {"max_stored_bytes_per_owner": len(content) + rows + rows // 2,
            "max_files_per_owner": 3}


def check_batch_storage(url: str, content: bytes, stored_rows: Callable[[], int]) -> None:
    """A batch's request rows count toward its owner's limits (:func:`storage_settings`)
    until it ends, then go (``stored_rows``: the request rows in the database)."""
    rows = sum(len(body) for _, _, body in parse_input(content, ENDPOINT, 100))
    with client(url, "owner") as c:
        f = c.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
        first = c.batches.create(input_file_id=f.id, endpoint=ENDPOINT,
                                 completion_window="24h")
        with pytest.raises(openai.APIStatusError) as refused:
            c.batches.create(input_file_id=f.id, endpoint=ENDPOINT, completion_window="24h")
        err = refused.value
        assert err.status_code == 413 and err.code == "storage_quota_exceeded", err
        assert "batch.max_stored_bytes_per_owner" in err.message
        assert f"already stores {len(content) + rows} bytes in 2 files" in err.message
        assert [b.id for b in c.batches.list().data] == [first.id]  # nothing stored
        # Deleting the input file does not free the running batch's copy of it.
        assert c.files.delete(f.id).deleted
        f = c.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
        with pytest.raises(openai.APIStatusError) as refused:
            c.batches.create(input_file_id=f.id, endpoint=ENDPOINT, completion_window="24h")
        assert refused.value.code == "storage_quota_exceeded"
        # The count: two files and the running batch (its future output file) make three.
        small = c.files.create(file=("in.jsonl", io.BytesIO(jsonl(1))), purpose="batch")
        with pytest.raises(openai.APIStatusError) as refused:
            c.batches.create(input_file_id=small.id, endpoint=ENDPOINT,
                             completion_window="24h")
        assert refused.value.code == "file_count_quota_exceeded"
        assert "batch.max_files_per_owner" in refused.value.message
        assert [b.id for b in c.batches.list().data] == [first.id]
        done = wait_batch(c, first.id, lambda b: b.status == "completed")
        assert done.request_counts.completed == 6
        assert stored_rows() == 0  # its answers are in its output file; the copy is gone
        assert len(c.files.content(done.output_file_id).text.splitlines()) == 6
        assert c.files.delete(done.output_file_id).deleted
        again = c.batches.create(input_file_id=small.id, endpoint=ENDPOINT,
                                 completion_window="24h")  # room again
        wait_batch(c, again.id, lambda b: b.status == "completed")
    assert stored_rows() == 0


def test_a_batch_counts_toward_its_owners_storage_and_its_rows_go_when_it_ends(
        serve_asgi: Any, tmp_path: Path) -> None:
    sim = start_sim(serve_asgi, ttft_s=0.2)  # the first batch runs while the others are tried
    content, db = jsonl(6), tmp_path / "batch.db"
    s = settings(sim.url, db, 1, batch=storage_settings(content))
    check_batch_storage(str(serve_asgi(create_app(s)).url), content, lambda: _rows(db))


@pytest.mark.parametrize(("limits", "code"), [
    ({"tokens_per_day": 1}, "request_too_large"),  # x-should-retry: false, no wait helps
    ({"requests_per_minute": 1}, "rate_limit_exceeded"),  # retry-after ~60 s > 1 s window
])
def test_an_answer_that_cannot_succeed_in_the_retry_window_is_not_retried(
        serve_asgi: Any, tmp_path: Path, limits: dict[str, int], code: str) -> None:
    sim = start_sim(serve_asgi)
    s = settings(sim.url, tmp_path / "batch.db", 2,
                 batch={"retries": 5, "retry_max_wait_s": 1},
                 quotas={"enabled": True, "backend": "memory", "keys": {"owner": limits}})
    url = str(serve_asgi(create_app(s, assemble(s))).url)  # assembled: with the quotas
    n = 4
    with client(url, "owner") as c:
        start = time.monotonic()
        b = submit(c, jsonl(n))
        # Retried, each line would wait 0.5 + 1 + 1 + 1 + 1 s: 9 s for 4 lines on 2 slots.
        b = wait_batch(c, b.id, lambda b: b.status == "completed", timeout_s=30)
        elapsed = time.monotonic() - start
        errors = [json.loads(x) for x in c.files.content(b.error_file_id).text.splitlines()]
    refused = [e for e in errors if e["error"]["code"] == code]
    assert len(refused) >= n - 1, errors  # a rate of 1/min lets one through
    assert {e["response"]["status_code"] for e in refused} == {429}
    assert elapsed < 3.0, elapsed
    assert sim.stats()["received"] == n - len(refused)  # refused lines never went upstream


def test_a_throttled_key_does_not_hold_the_batch_slots_of_another(
        serve_asgi: Any, tmp_path: Path) -> None:
    sim = start_sim(serve_asgi)
    # The owner may send one request a minute and the runner waits up to 2 min to retry:
    # its second and third lines wait ~60 s each (within the window, so retried).
    s = settings(sim.url, tmp_path / "batch.db", 2,
                 batch={"retries": 2, "retry_max_wait_s": 120},
                 quotas={"enabled": True, "backend": "memory",
                         "keys": {"owner": {"requests_per_minute": 1}}})
    url = str(serve_asgi(create_app(s, assemble(s))).url)  # assembled: with the quotas
    with client(url, "owner") as owner, client(url, "other") as other:
        throttled = submit(owner, jsonl(3))
        wait_batch(owner, throttled.id, lambda b: b.request_counts.completed == 1)
        time.sleep(0.3)  # its two other lines are now waiting to be retried
        start = time.monotonic()
        b = submit(other, jsonl(1))
        b = wait_batch(other, b.id, lambda b: b.status == "completed", timeout_s=20)
        elapsed = time.monotonic() - start
        assert b.request_counts.completed == 1
        assert owner.batches.retrieve(throttled.id).status == "in_progress"
    assert elapsed < 3.0, elapsed  # not the ~60 s of the other key's retry-after


def test_slots_are_handed_round_robin_between_owners() -> None:
    """One owner with three waiting requests and another with one, one slot: the other
    owner's request runs second, not last."""
    async def scenario() -> list[str]:
        slots, order = FairSlots(1), []
        await slots.acquire("a")

        async def one(owner: str, name: str) -> None:
            await slots.acquire(owner)
            order.append(name)
            await asyncio.sleep(0)
            slots.release()

        tasks = []
        for owner, name in (("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1")):
            tasks.append(asyncio.create_task(one(owner, name)))
            await asyncio.sleep(0)  # queued in this order
        slots.release()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["a1", "b1", "a2", "a3"]
