"""The KV-event decoder and exact index against a real vLLM's events (opt-in, marker ``vllm``).

Needs a vLLM server at ``SG_VLLM_URL`` started with ``--kv-events-config`` publishing on
``SG_VLLM_KV_EVENTS`` (``tcp://127.0.0.1:PORT``) with replay on ``SG_VLLM_KV_REPLAY``;
``make test-vllm`` (``tests/integration/run_vllm.py``) starts it so.

Checks: every message is three frames with an 8-byte sequence number and a payload our decoder
reads; a completion given as token ids produces ``BlockStored`` events whose tokens are the
prompt's own full blocks; the exact index built from them matches the prompt's content keys,
and a replay from 0 returns the same batches.
"""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import pytest
import zmq
import zmq.asyncio

from gateway.fleet.exact_index import ExactIndex, content_keys
from gateway.fleet.kv_events import BlockStored, decode_batch, decode_seq
from gateway.fleet.kv_subscriber import KVEventSubscriber
from gateway.fleet.settings import KVEventsSource

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not os.environ.get("SG_VLLM_KV_EVENTS"),
                       reason="set SG_VLLM_KV_EVENTS (make test-vllm)"),
]

URL = os.environ.get("SG_VLLM_URL", "").rstrip("/")
MODEL = os.environ.get("SG_VLLM_MODEL", "tiny")
PUB = os.environ.get("SG_VLLM_KV_EVENTS", "")
REPLAY = os.environ.get("SG_VLLM_KV_REPLAY") or None


def _complete(ids: list[int]) -> None:
    r = httpx.post(f"{URL}/v1/completions", timeout=120,
                   json={"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0})
    assert r.is_success, r.text


def test_real_vllm_events_decode_and_fill_the_exact_index() -> None:
    ids = [100 + (i * 7919) % 20000 for i in range(16 * 6 + 5)]  # 6 full blocks of 16 + 5

    async def run() -> None:
        ctx = zmq.asyncio.Context()
        raw = ctx.socket(zmq.SUB)
        raw.setsockopt(zmq.SUBSCRIBE, b"")
        raw.connect(PUB)
        idx = ExactIndex(1)
        sub = KVEventSubscriber(KVEventsSource(replica=URL, endpoint=PUB, replay_endpoint=REPLAY),
                                lambda evs: idx.apply(0, evs), lambda: idx.clear(0), ctx)
        sub.start()
        stored: list[BlockStored] = []
        try:
            deadline = time.monotonic() + 60
            while not stored:
                assert time.monotonic() < deadline, "no BlockStored from vLLM"
                await asyncio.to_thread(_complete, ids)  # again until the SUB socket has joined
                while await raw.poll(500):
                    frames = await raw.recv_multipart()
                    assert len(frames) == 3 and len(frames[1]) == 8
                    assert decode_seq(frames[1]) >= 0
                    batch = decode_batch(frames[2])
                    stored += [e for e in batch.events if isinstance(e, BlockStored)
                               and e.token_ids[: e.block_size] in _blocks(ids, e.block_size)]
            size = stored[0].block_size
            got = [t for e in stored for t in e.token_ids]
            assert got[: len(got) - len(got) % size] == list(ids[: len(got) - len(got) % size])
            keys = content_keys(ids, size)
            deadline = time.monotonic() + 30
            while idx.match(keys, [0])[0] < (len(ids) - 1) // size:
                assert time.monotonic() < deadline, "exact index did not reach the prompt"
                await asyncio.sleep(0.05)
            assert idx.replicas[0].block_size == size and sub.exact()
        finally:
            await sub.stop()
            raw.close(linger=0)
            ctx.term()

    asyncio.run(run())


def _blocks(ids: list[int], size: int) -> list[tuple[int, ...]]:
    return [tuple(ids[i : i + size]) for i in range(0, len(ids) - size + 1, size)]
