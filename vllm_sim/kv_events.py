"""The simulator's KV-cache event publisher, in vLLM's wire format (``--kv-events-config``).

As vLLM's ``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``): a PUB socket sends one
``(topic, seq as 8 bytes big-endian, msgpack batch)`` message per engine step that changed the
prefix cache; a ROUTER replay socket answers a request carrying a start sequence number (8 bytes
big-endian) with one ``(seq, payload)`` message per buffered batch from there, then ``(-1,
b"")``. Batches and events are msgspec-style structs: maps with a ``"type"`` tag (vLLM >= 0.12)
or, with ``layout: array``, tagged arrays in field order (vLLM <= 0.11). Block hashes are sent
in vLLM's integer form (64 bits, ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``); the simulator's own
hashes are Python's, not vLLM's SHA-256 (only equality matters to a consumer).

``drop_next(n)`` makes the next *n* batches skip the PUB socket (they stay in the replay
buffer): a sequence gap for a subscriber's replay to fill, as a lossy network would make one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack
import zmq
import zmq.asyncio

__all__ = ["Cleared", "KVEventPublisher", "Removed", "Stored", "encode_batch"]

_log = logging.getLogger(__name__)
_MASK64 = (1 << 64) - 1
_END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True, slots=True)
class Stored:
    """Consecutive full blocks newly cached (``parent`` None: they start the prompt)."""

    hashes: tuple[int, ...]
    parent: int | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True, slots=True)
class Removed:
    """Blocks evicted from the cache."""

    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Cleared:
    """The whole prefix cache was dropped."""


SimEvent = Stored | Removed | Cleared


def _h(value: int) -> int:
    return value & _MASK64


def _event(ev: SimEvent, layout: str) -> Any:
    if isinstance(ev, Stored):
        fields: list[tuple[str, Any]] = [
            ("block_hashes", [_h(h) for h in ev.hashes]),
            ("parent_block_hash", None if ev.parent is None else _h(ev.parent)),
            ("token_ids", list(ev.token_ids)),
            ("block_size", ev.block_size),
            ("lora_id", None),
            ("medium", "GPU"),
            ("lora_name", None),
        ]
        tag = "BlockStored"
    elif isinstance(ev, Removed):
        fields = [("block_hashes", [_h(h) for h in ev.hashes]), ("medium", "GPU")]
        tag = "BlockRemoved"
    else:
        fields = []
        tag = "AllBlocksCleared"
    if layout == "array":
        return [tag, *(v for _, v in fields)]
    return {"type": tag, **dict(fields)}


def encode_batch(ts: float, events: Sequence[SimEvent], layout: str = "map",
                 rank: int | None = 0) -> bytes:
    """The msgpack payload of one ``KVEventBatch`` (see the module docstring)."""
    evs = [_event(e, layout) for e in events]
    doc: Any
    if layout == "array":
        doc = [ts, evs] if rank is None else [ts, evs, rank]
    else:
        doc = {"ts": ts, "events": evs}
        if rank is not None:
            doc["data_parallel_rank"] = rank
    payload: bytes = msgpack.packb(doc, use_bin_type=True)
    return payload


class KVEventPublisher:
    """PUB + ROUTER replay sockets of one simulated replica.

    Args:
        endpoint: PUB address to bind (``tcp://127.0.0.1:5557``).
        replay_endpoint: ROUTER address to bind, or None (no replay).
        topic: Topic frame of every message.
        layout: ``map`` (vLLM >= 0.12) or ``array`` (vLLM <= 0.11).
        buffer_steps: Batches kept for replay (vLLM's default: 10,000).
    """

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "",
                 layout: Literal["map", "array"] = "map", buffer_steps: int = 10_000) -> None:
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self._topic = topic.encode()
        self._layout = layout
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._drop = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self.published = 0

    def start(self) -> None:
        """Bind the sockets and serve replay requests (inside the running event loop)."""
        self._ctx = zmq.asyncio.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, 100_000)
        self._pub.bind(self.endpoint)
        if self.replay_endpoint is not None:
            self._router = self._ctx.socket(zmq.ROUTER)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(self.replay_endpoint)
            self._task = asyncio.get_running_loop().create_task(self._serve_replay())

    async def close(self) -> None:
        """Stop serving and close the sockets."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def describe(self) -> dict[str, Any]:
        """Bound addresses (a ``:*`` port resolved) and counters, for ``GET /sim/stats``."""
        def bound(sock: zmq.asyncio.Socket | None) -> str | None:
            if sock is None:
                return None
            last = sock.getsockopt(zmq.LAST_ENDPOINT)
            return last.decode() if isinstance(last, bytes) else str(last)
        return {"endpoint": bound(self._pub), "replay_endpoint": bound(self._router),
                "next_seq": self._seq, "published": self.published}

    def drop_next(self, n: int) -> None:
        """Keep the next ``n`` batches off the PUB socket (replay still has them)."""
        self._drop = n

    def publish(self, events: Sequence[SimEvent]) -> None:
        """Number, buffer and send one batch (nothing when ``events`` is empty)."""
        if not events or self._pub is None:
            return
        seq = self._seq
        self._seq += 1
        payload = encode_batch(time.time(), events, self._layout)
        self._buffer.append((seq, payload))
        if self._drop:
            self._drop -= 1
            return
        # PUB never blocks: past the high-water mark ZMQ drops, as vLLM's publisher does.
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self.published += 1

    async def _serve_replay(self) -> None:
        assert self._router is not None
        while True:
            frames = await self._router.recv_multipart()
            if len(frames) != 3:
                _log.warning("kv events replay: request of %d frames ignored", len(frames))
                continue
            client, _, start_bytes = frames
            start = int.from_bytes(start_bytes, "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await self._router.send_multipart(
                        (client, b"", seq.to_bytes(8, "big"), payload))
            await self._router.send_multipart((client, b"", _END_SEQ, b""))
