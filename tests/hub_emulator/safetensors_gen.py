"""Write valid safetensors files (format: 8-byte little-endian header length, JSON header with
``dtype``/``shape``/``data_offsets`` per tensor and optional ``__metadata__``, then raw data),
as specified by https://github.com/huggingface/safetensors."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
               "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def make_safetensors(
    tensors: Mapping[str, tuple[str, Sequence[int]]],
    *,
    metadata: Mapping[str, str] | None = None,
    fill: int = 0,
) -> bytes:
    """Return the bytes of a safetensors file.

    Args:
        tensors: name -> (dtype, shape). Data is ``fill`` bytes mixed with the tensor index so
            files differ.
        metadata: Optional ``__metadata__`` string map.
        fill: Seed byte for the data.
    """
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    parts: list[bytes] = []
    for i, (name, (dtype, shape)) in enumerate(sorted(tensors.items())):
        n = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        parts.append(bytes([(fill + i) % 256]) * n)
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(parts)


def make_sharded(
    shards: Sequence[Mapping[str, tuple[str, Sequence[int]]]], prefix: str = "model"
) -> dict[str, bytes]:
    """Return ``{filename: bytes}`` of a sharded checkpoint plus its ``.index.json``."""
    n = len(shards)
    files: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for i, tensors in enumerate(shards, start=1):
        name = f"{prefix}-{i:05d}-of-{n:05d}.safetensors"
        files[name] = make_safetensors(tensors, fill=i)
        for t, (dtype, shape) in tensors.items():
            weight_map[t] = name
            total += math.prod(shape) * DTYPE_BYTES[dtype]
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    files[f"{prefix}.safetensors.index.json"] = (json.dumps(index, indent=2) + "\n").encode()
    return files
