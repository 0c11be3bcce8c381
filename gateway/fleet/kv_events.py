"""Decoder of vLLM's KV-cache event stream (``--kv-events-config``, ZMQ publisher).

Wire format (vLLM ``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``):

* Each published message is a ZMQ multipart of three frames: the topic (UTF-8, ``""`` by
  default), the batch's sequence number as an 8-byte big-endian unsigned integer (0, 1, 2, ...
  per publisher, one per scheduler step that had events), and the msgpack payload of one
  ``KVEventBatch``.
* Replay: a DEALER/REQ sends one frame, the first wanted sequence number (8 bytes big-endian),
  to the publisher's ROUTER ``replay_endpoint``; it answers one ``(seq, payload)`` two-frame
  message per buffered batch from that number on (REQ sockets also see the empty delimiter
  frame first) and ends with ``(-1 as 8-byte signed big-endian, b"")``.
* The payload is a msgspec ``Struct`` encoding. ``EventBatch`` has ``ts: float``, ``events``
  and ``data_parallel_rank: int | None = None``; each event is a tagged struct whose tag is its
  class name: ``BlockStored`` (``block_hashes``, ``parent_block_hash``, ``token_ids``,
  ``block_size``, ``lora_id``, ``medium``, ``lora_name``, then defaulted ``extra_keys``,
  ``group_idx``, ``kv_cache_spec_kind``, ``kv_cache_spec_sliding_window``), ``BlockRemoved``
  (``block_hashes``, ``medium``, ``group_idx``), ``AllBlocksCleared``. vLLM up to 0.11 encodes
  them ``array_like`` (a batch is ``[ts, events, rank]``, an event ``["BlockStored", hashes,
  parent, ...]`` in field order, trailing defaults omitted); later versions encode maps (an
  event ``{"type": "BlockStored", "block_hashes": ..., ...}``, defaulted fields omitted). Both
  are decoded here.
* A block hash (``ExternalBlockHash``) is ``bytes`` (vLLM's 32-byte ``BlockHash``) or, with
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, the low 64 bits of it as an ``int``. vLLM computes
  ``hash_fn((parent_hash or NONE_HASH, tuple(token_ids), extra_keys))`` with ``hash_fn`` from
  ``--prefix-caching-hash-algo`` (``sha256_cbor`` by default) and ``NONE_HASH =
  hash_fn(PYTHONHASHSEED)``, or 32 random bytes when ``PYTHONHASHSEED`` is unset. The gateway
  does not recompute these hashes (so it needs no shared seed): it keys blocks by their token
  content, chained through ``parent_block_hash`` (:mod:`gateway.fleet.exact_index`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

__all__ = [
    "END_SEQ",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVEventDecodeError",
    "decode_batch",
    "decode_seq",
]

END_SEQ = -1
"""Sequence number of the replay socket's end marker."""

BlockHash = bytes | int


class KVEventDecodeError(ValueError):
    """A frame is not a vLLM KV event batch (its problem in the message)."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks a replica cached, in prefix order.

    Attributes:
        block_hashes: vLLM's hashes of the blocks, in order.
        parent_block_hash: Hash of the block before the first one (``None``: prompt start).
        token_ids: The blocks' tokens, ``block_size`` per block, concatenated.
        block_size: Tokens per block.
        lora_name: The LoRA adapter the blocks belong to, if any.
        extra_keys: Per block, the extra hash keys (multimodal ids, cache salt, ...) or None.
        group_idx: KV-cache group (hybrid models), or None.
    """

    block_hashes: tuple[BlockHash, ...]
    parent_block_hash: BlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_name: str | None = None
    extra_keys: tuple[Any, ...] | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks a replica evicted (by hash)."""

    block_hashes: tuple[BlockHash, ...]
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The replica dropped its whole prefix cache (``reset_prefix_cache``)."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """The events of one scheduler step.

    Attributes:
        ts: The replica's wall-clock time of the step (seconds since the epoch).
        events: In order.
        data_parallel_rank: The data-parallel rank that published it, if given.
    """

    ts: float
    events: tuple[Event, ...]
    data_parallel_rank: int | None = None


_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                  "medium", "lora_name", "extra_keys", "group_idx")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


def decode_seq(frame: bytes) -> int:
    """The sequence number of a sequence frame (8 bytes big-endian; -1 is the replay end).

    Raises:
        KVEventDecodeError: The frame is not 8 bytes.
    """
    if len(frame) != 8:
        raise KVEventDecodeError(f"sequence frame of {len(frame)} bytes, expected 8")
    seq = int.from_bytes(frame, "big", signed=True)
    return seq


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one msgpack ``KVEventBatch`` (array-like or map layout).

    Raises:
        KVEventDecodeError: Not msgpack, or not the shape of an event batch; the message says
            which part.
    """
    try:
        doc = msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise KVEventDecodeError(f"payload is not msgpack: {exc}") from exc
    if isinstance(doc, list):
        if len(doc) < 2:
            raise KVEventDecodeError("batch array has fewer than 2 fields (ts, events)")
        ts, events, rank = doc[0], doc[1], doc[2] if len(doc) > 2 else None
    elif isinstance(doc, dict):
        if "ts" not in doc or "events" not in doc:
            raise KVEventDecodeError("batch map lacks 'ts' or 'events'")
        ts, events, rank = doc["ts"], doc["events"], doc.get("data_parallel_rank")
    else:
        raise KVEventDecodeError(f"batch is a {type(doc).__name__}, not an array or map")
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        raise KVEventDecodeError("batch 'ts' is not a number")
    if not isinstance(events, list):
        raise KVEventDecodeError("batch 'events' is not an array")
    if rank is not None and not isinstance(rank, int):
        raise KVEventDecodeError("batch 'data_parallel_rank' is not an integer")
    return EventBatch(float(ts), tuple(_event(e, i) for i, e in enumerate(events)), rank)


def _fields(raw: Any, names: Sequence[str], where: str) -> tuple[str, Mapping[str, Any]]:
    """The tag and the named fields of one tagged struct, from either layout."""
    if isinstance(raw, list):
        if not raw or not isinstance(raw[0], str):
            raise KVEventDecodeError(f"{where}: array without a tag")
        return raw[0], dict(zip(names, raw[1:], strict=False))
    if isinstance(raw, dict):
        tag = raw.get("type")
        if not isinstance(tag, str):
            raise KVEventDecodeError(f"{where}: map without a 'type' tag")
        return tag, raw
    raise KVEventDecodeError(f"{where}: a {type(raw).__name__}, not an event")


def _hash(value: Any, where: str) -> BlockHash:
    if isinstance(value, bool) or not isinstance(value, (bytes, int)):
        raise KVEventDecodeError(f"{where}: block hash is not bytes or an integer")
    return value


def _event(raw: Any, i: int) -> Event:
    where = f"event {i}"
    tag = raw[0] if isinstance(raw, list) and raw else (raw.get("type")
                                                         if isinstance(raw, dict) else None)
    if tag == "BlockStored":
        _, f = _fields(raw, _STORED_FIELDS, where)
        hashes = f.get("block_hashes")
        tokens = f.get("token_ids")
        size = f.get("block_size")
        if not isinstance(hashes, list) or not isinstance(tokens, list):
            raise KVEventDecodeError(f"{where}: BlockStored without block_hashes or token_ids")
        if not isinstance(size, int) or size <= 0:
            raise KVEventDecodeError(f"{where}: BlockStored block_size is not a positive int")
        if len(tokens) != len(hashes) * size:
            raise KVEventDecodeError(
                f"{where}: BlockStored has {len(tokens)} tokens for {len(hashes)} blocks of "
                f"{size}")
        if not all(isinstance(t, int) for t in tokens):
            raise KVEventDecodeError(f"{where}: BlockStored token_ids are not integers")
        parent = f.get("parent_block_hash")
        extra = f.get("extra_keys")
        lora = f.get("lora_name")
        group = f.get("group_idx")
        return BlockStored(
            tuple(_hash(h, where) for h in hashes),
            None if parent is None else _hash(parent, where),
            tuple(tokens),
            size,
            lora if isinstance(lora, str) else None,
            tuple(_freeze(x) for x in extra) if isinstance(extra, list) else None,
            group if isinstance(group, int) else None,
        )
    if tag == "BlockRemoved":
        _, f = _fields(raw, _REMOVED_FIELDS, where)
        hashes = f.get("block_hashes")
        if not isinstance(hashes, list):
            raise KVEventDecodeError(f"{where}: BlockRemoved without block_hashes")
        group = f.get("group_idx")
        return BlockRemoved(tuple(_hash(h, where) for h in hashes),
                            group if isinstance(group, int) else None)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise KVEventDecodeError(f"{where}: unknown event tag {tag!r}")


def _freeze(value: Any) -> Any:
    """Lists to tuples, recursively (extra keys take part in a hashable block key)."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value
