"""vLLM KV-event wire decoding and the exact block index, from hand-built wire bytes.

The bytes are written out by hand from vLLM's structs (``vllm/distributed/kv_events.py``:
msgspec, ``tag=True``, ``omit_defaults=True``; array-like up to 0.11, maps after).
"""

from __future__ import annotations

import struct

import msgpack
import pytest
import zmq.asyncio

from gateway.config.errors import InvalidConfig
from gateway.config.loader import parse
from gateway.fleet.exact_index import ExactIndex, content_keys
from gateway.fleet.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventDecodeError,
    decode_batch,
    decode_seq,
)
from gateway.fleet.kv_subscriber import KVEventSubscriber
from gateway.fleet.settings import KVEventsSource, check_endpoint
from tests.gateway.helpers import config

F15 = b"\xcb" + struct.pack(">d", 1.5)


def test_sequence_frames_are_8_byte_big_endian_and_minus_one_ends_a_replay() -> None:
    assert decode_seq(b"\x00" * 7 + b"\x05") == 5
    assert decode_seq(b"\x00\x00\x00\x01\x00\x00\x00\x00") == 1 << 32
    assert decode_seq(b"\xff" * 8) == -1
    with pytest.raises(KVEventDecodeError, match="4 bytes"):
        decode_seq(b"\x00\x00\x00\x01")


def test_array_like_batch_of_vllm_0_11_with_int_hashes() -> None:
    # [1.5, [["BlockStored", [7, 8], None, [1, 2, 3, 4], 2, None, "GPU", None],
    #        ["BlockRemoved", [7], "GPU"]], 0]
    wire = (b"\x93" + F15 + b"\x92"
            + b"\x98\xabBlockStored\x92\x07\x08\xc0\x94\x01\x02\x03\x04\x02\xc0\xa3GPU\xc0"
            + b"\x93\xacBlockRemoved\x91\x07\xa3GPU"
            + b"\x00")
    batch = decode_batch(wire)
    assert batch.ts == 1.5 and batch.data_parallel_rank == 0
    assert batch.events == (
        BlockStored((7, 8), None, (1, 2, 3, 4), 2, None, None, None),
        BlockRemoved((7,)),
    )


def test_map_batch_of_current_vllm_with_bytes_hashes_and_omitted_defaults() -> None:
    h1, h2 = bytes(range(32)), bytes(range(1, 33))
    # {"ts": 1.5, "events": [{"type": "BlockStored", "block_hashes": [h2],
    #   "parent_block_hash": h1, "token_ids": [9, 9], "block_size": 2, "lora_id": None,
    #   "medium": "GPU", "lora_name": "ad"}, {"type": "AllBlocksCleared"}]}
    stored = (b"\x88\xa4type\xabBlockStored"
              + b"\xacblock_hashes\x91\xc4\x20" + h2
              + b"\xb1parent_block_hash\xc4\x20" + h1
              + b"\xa9token_ids\x92\x09\x09"
              + b"\xaablock_size\x02"
              + b"\xa7lora_id\xc0"
              + b"\xa6medium\xa3GPU"
              + b"\xa9lora_name\xa2ad")
    wire = (b"\x82\xa2ts" + F15 + b"\xa6events\x92" + stored
            + b"\x81\xa4type\xb0AllBlocksCleared")
    batch = decode_batch(wire)
    assert batch.data_parallel_rank is None
    assert batch.events == (BlockStored((h2,), h1, (9, 9), 2, "ad"), AllBlocksCleared())


@pytest.mark.parametrize(("doc", "problem"), [
    ({"ts": 1.0}, "lacks 'ts' or 'events'"),
    ([1.0, [["BlockStored", [1], None, [1, 2, 3], 2, None, None, None]]], "3 tokens for 1"),
    ([1.0, [["Mystery"]]], "unknown event tag 'Mystery'"),
    ([1.0, [["BlockRemoved", ["x"], None]]], "not bytes or an integer"),
    ("text", "not an array or map"),
])
def test_malformed_batches_are_refused_naming_the_part(doc: object, problem: str) -> None:
    with pytest.raises(KVEventDecodeError, match=problem):
        decode_batch(msgpack.packb(doc))


def test_not_msgpack_is_refused() -> None:
    with pytest.raises(KVEventDecodeError, match="not msgpack"):
        decode_batch(b"\xc1")


def _stored(hashes: list[int], parent: int | None, tokens: list[int]) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(tokens), 2)


def test_exact_index_follows_stores_removals_and_clears() -> None:
    idx = ExactIndex(2)
    prompt = [1, 2, 3, 4, 5, 6, 7]
    keys = content_keys(prompt, 2)
    assert len(keys) == 3
    idx.apply(0, [_stored([10, 11], None, [1, 2, 3, 4])])
    idx.apply(0, [_stored([12], 11, [5, 6])])  # continues through its parent's hash
    idx.apply(1, [_stored([20], None, [1, 2])])
    assert idx.match(keys, [0, 1]) == {0: 3, 1: 1}
    idx.apply(0, [BlockRemoved((11,))])  # a hole: reuse stops before it
    assert idx.match(keys, [0, 1]) == {0: 1, 1: 1}
    idx.apply(1, [AllBlocksCleared()])
    assert idx.match(keys, [0, 1]) == {0: 1, 1: 0}
    assert idx.size(1) == 0 and idx.size(0) == 2


def test_a_block_whose_parent_is_unknown_is_counted_and_skipped() -> None:
    idx = ExactIndex(1)
    idx.apply(0, [_stored([31], 30, [3, 4])])
    assert idx.size(0) == 0 and idx.replicas[0].orphans == 1


def test_other_content_under_the_same_parent_does_not_match() -> None:
    idx = ExactIndex(1)
    idx.apply(0, [_stored([10, 11], None, [1, 2, 3, 4])])
    assert idx.match(content_keys([1, 2, 3, 9], 2), [0]) == {0: 1}
    assert idx.match(content_keys([1, 2, 3, 4], 2, lora="adapter"), [0]) == {0: 0}


def _frames(seq: int, events: list[object]) -> list[bytes]:
    return [b"", seq.to_bytes(8, "big"), msgpack.packb({"ts": 0.0, "events": events})]


def _stored_map(h: int, tokens: list[int], parent: int | None = None) -> dict[str, object]:
    return {"type": "BlockStored", "block_hashes": [h], "parent_block_hash": parent,
            "token_ids": tokens, "block_size": len(tokens), "lora_id": None, "medium": "GPU",
            "lora_name": None}


def test_a_duplicate_batch_is_skipped_and_a_restarted_publisher_clears_the_index() -> None:
    idx = ExactIndex(1)
    ctx = zmq.asyncio.Context()
    try:
        sub = KVEventSubscriber(KVEventsSource(replica="http://h:1", endpoint="tcp://h:2"),
                                lambda evs: idx.apply(0, evs), lambda: idx.clear(0), ctx)
        first = _frames(0, [_stored_map(1, [5, 6])])
        sub.handle(first)
        sub.handle(_frames(1, [_stored_map(2, [7, 8], parent=1)]))
        assert idx.size(0) == 2 and sub.exact()
        sub.handle(first)  # the same batch again (replay and SUB both delivered it)
        assert idx.size(0) == 2 and sub.stats.restarts == 0
        # A new process numbers from 0 again, with other content: start over.
        sub.handle(_frames(0, [_stored_map(9, [1, 1])]))
        assert sub.stats.restarts == 1 and idx.size(0) == 1
        assert idx.match(content_keys([1, 1, 0], 2), [0]) == {0: 1}
        sub.handle([b"only two", b"frames"])
        assert sub.stats.decode_errors == 1
    finally:
        ctx.term()


def test_event_endpoints_must_be_on_the_replicas_host() -> None:
    check_endpoint("tcp://10.0.0.5:5557", "http://10.0.0.5:8000")
    with pytest.raises(ValueError, match=r"is not the replica's host '10\.0\.0\.5'"):
        check_endpoint("tcp://10.9.9.9:5557", "http://10.0.0.5:8000")
    with pytest.raises(ValueError, match="expected tcp://host:port"):
        check_endpoint("ipc:///tmp/kv", "http://10.0.0.5:8000")


@pytest.mark.parametrize(("source", "problem"), [
    ({"replica": "http://10.0.0.5:8000", "endpoint": "tcp://10.9.9.9:5557"},
     "routing.kv_events[0].endpoint: 'tcp://10.9.9.9:5557': host '10.9.9.9' is not the "
     "replica's host '10.0.0.5'"),
    ({"replica": "http://10.0.0.5:8000", "endpoint": "tcp://10.0.0.5:5557",
      "replay_endpoint": "tcp://10.0.0.5"},
     "routing.kv_events[0].replay_endpoint: 'tcp://10.0.0.5': expected tcp://host:port"),
    ({"replica": "http://10.0.0.6:8000", "endpoint": "tcp://10.0.0.6:5557"},
     "routing.kv_events[0].replica: 'http://10.0.0.6:8000' is not the url of any model's "
     "replica"),
])
def test_the_config_refuses_event_sources_off_the_replicas(
    source: dict[str, str], problem: str,
) -> None:
    with pytest.raises(InvalidConfig) as exc:
        parse(config(["http://10.0.0.5:8000"], routing={"kv_events": [source]}),
              {"VLLM_KEY": "x"})
    assert problem in str(exc.value)
