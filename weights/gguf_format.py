"""A strict GGUF parser: a file is GGUF only if it parses the way ggml loads it.

Rules from the reference loader (ggml ``gguf_init_from_file_impl``, ggml/src/gguf.cpp, and
the format in ggml docs/gguf.md), checked against the file size before anything is allocated:

* magic ``GGUF``; version 2 or 3 (1 is no longer read; a byte-swapped version is refused);
* tensor and key-value counts that fit in the file (every item takes at least 8 bytes);
* every key-value: a string key (unique), a known value type; arrays of a scalar or string
  type (no nested arrays); ``general.alignment``, if present, a power-of-two ``uint32``;
* every tensor info: a unique name of at most 63 bytes, 1..4 dimensions, each at least 0
  with no overflow of the element count past 2**63, a known ggml type whose block divides
  the first dimension, and an offset equal to the running, alignment-padded data size;
* the data section (aligned after the header) lies within the file.

Sources: ggml/src/gguf.cpp and ggml/src/ggml.c (type traits: block size, bytes per block).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import BinaryIO

from weights.errors import WeightsError

#: ggml tensor types: type id -> (name, elements per block, bytes per block) (ggml.c).
GGML_TYPES: Mapping[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}

#: GGUF value types -> struct format of a scalar (strings and arrays handled apart).
_SCALARS: Mapping[int, str] = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i",
                               6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64
DEFAULT_ALIGNMENT = 32
_I64_MAX = 2**63 - 1


class MalformedGGUF(WeightsError):
    """A file is not a well-formed GGUF file (what ggml would refuse to load)."""

    code = "malformed_gguf"

    def __init__(self, message: str) -> None:
        super().__init__(f"not a valid GGUF file: {message}",
                         hint="re-export the model with llama.cpp's convert tools")


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor info: name, ggml type name, dimensions, offset within the data section."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class GGUFHeader:
    """A validated GGUF header.

    Attributes:
        version: Format version (2 or 3).
        metadata_keys: Every key-value key, in file order (values are not kept).
        tensors: Every tensor info.
        data_start: Byte offset of the data section.
        data_bytes: Bytes the tensors take in the data section (padded).
    """

    version: int
    metadata_keys: tuple[str, ...]
    tensors: tuple[GGUFTensor, ...]
    data_start: int
    data_bytes: int


class _Reader:
    def __init__(self, fh: BinaryIO, size: int) -> None:
        self.fh, self.size, self.pos = fh, size, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise MalformedGGUF(f"{what} at byte {self.pos} runs past the end of the file")
        data = self.fh.read(n)
        if len(data) != n:
            raise MalformedGGUF(f"{what} at byte {self.pos}: file truncated")
        self.pos += n
        return data

    def unpack(self, fmt: str, what: str) -> int | float:
        value: int | float = struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]
        return value

    def uint(self, fmt: str, what: str) -> int:
        return int(self.unpack(fmt, what))

    def string(self, what: str) -> str:
        n = self.uint("<Q", f"{what} length")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedGGUF(f"{what} is not UTF-8") from exc

    def skip(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise MalformedGGUF(f"{what} at byte {self.pos} runs past the end of the file")
        self.fh.seek(n, 1)
        self.pos += n


def _value(r: _Reader, vtype: int, key: str, *, in_array: bool = False) -> int | None:
    """Read (or skip) one value; returns a uint32 value (for general.alignment) or None."""
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        v = r.unpack(fmt, f"value of {key!r}")
        return int(v) if vtype == 4 else None
    if vtype == _STRING:
        n = r.uint("<Q", f"string length in {key!r}")
        r.skip(n, f"string in {key!r}")
        return None
    if vtype == _ARRAY and not in_array:
        etype = r.uint("<I", f"array type of {key!r}")
        count = r.uint("<Q", f"array length of {key!r}")
        if etype == _ARRAY or (etype not in _SCALARS and etype != _STRING):
            raise MalformedGGUF(f"key {key!r}: array of unsupported type {etype}")
        if etype in _SCALARS:
            r.skip(count * struct.calcsize(_SCALARS[etype]), f"array {key!r}")
        else:
            if count * 8 > r.size - r.pos:
                raise MalformedGGUF(f"key {key!r}: {count} strings cannot fit in the file")
            for _ in range(count):
                _value(r, _STRING, key, in_array=True)
        return None
    raise MalformedGGUF(f"key {key!r} has unknown value type {vtype}")


def parse_gguf(fh: BinaryIO, size: int) -> GGUFHeader:
    """Parse and validate a GGUF file's header against its size (no tensor data is read).

    Args:
        fh: The file, positioned at 0.
        size: The file size in bytes.

    Returns:
        The validated header.

    Raises:
        MalformedGGUF: Anything ggml refuses (see the module docstring).
        OSError: The file cannot be read.
    """
    r = _Reader(fh, size)
    if r.take(4, "magic") != b"GGUF":
        raise MalformedGGUF("no GGUF magic")
    version = r.uint("<I", "version")
    if version & 0xFFFF == 0:
        raise MalformedGGUF(f"version {version:#x} (byte-swapped file)")
    if version not in (2, 3):
        raise MalformedGGUF(f"version {version} is not read (2 or 3)")
    n_tensors = r.uint("<q", "tensor count")
    n_kv = r.uint("<q", "key-value count")
    if n_tensors < 0 or n_kv < 0 or (n_tensors + n_kv) * 8 > size - r.pos:
        raise MalformedGGUF(f"{n_tensors} tensors and {n_kv} key-values cannot fit in "
                            f"{size} bytes")
    keys: list[str] = []
    seen_keys: set[str] = set()
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = r.string("key")
        if key in seen_keys:
            raise MalformedGGUF(f"key {key!r} appears twice")
        seen_keys.add(key)
        keys.append(key)
        vtype = r.uint("<I", f"value type of {key!r}")
        value = _value(r, vtype, key)
        if key == "general.alignment":
            if vtype != 4 or value is None or value == 0 or value & (value - 1):
                raise MalformedGGUF("general.alignment is not a power-of-two uint32")
            alignment = value
    tensors: list[GGUFTensor] = []
    names: set[str] = set()
    expected = 0
    for _ in range(n_tensors):
        name = r.string("tensor name")
        if len(name.encode()) >= GGML_MAX_NAME:
            raise MalformedGGUF(f"tensor name {name[:70]!r} is longer than {GGML_MAX_NAME - 1}")
        if name in names:
            raise MalformedGGUF(f"tensor {name!r} appears twice")
        names.add(name)
        n_dims = r.uint("<I", f"dimensions of {name!r}")
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            raise MalformedGGUF(f"tensor {name!r} has {n_dims} dimensions (1..4)")
        shape = tuple(r.uint("<q", f"dimension of {name!r}") for _ in range(n_dims))
        elements = 1
        for d in shape:
            if d < 0:
                raise MalformedGGUF(f"tensor {name!r} has a negative dimension")
            elements *= d
            if elements > _I64_MAX:
                raise MalformedGGUF(f"tensor {name!r}: element count overflows")
        ttype = r.uint("<I", f"type of {name!r}")
        if ttype not in GGML_TYPES:
            raise MalformedGGUF(f"tensor {name!r} has unknown ggml type {ttype}")
        tname, block, block_bytes = GGML_TYPES[ttype]
        if shape[0] % block:
            raise MalformedGGUF(f"tensor {name!r}: first dimension {shape[0]} is not a "
                                f"multiple of the {tname} block size {block}")
        offset = r.uint("<Q", f"offset of {name!r}")
        if offset != expected:
            raise MalformedGGUF(f"tensor {name!r} at data offset {offset}, {expected} expected")
        nbytes = elements // block * block_bytes
        expected += -(-nbytes // alignment) * alignment
        tensors.append(GGUFTensor(name=name, type_name=tname, shape=shape, offset=offset))
    data_start = -(-r.pos // alignment) * alignment
    if data_start + expected > size:
        raise MalformedGGUF(f"the tensor data ({expected} bytes from byte {data_start}) runs "
                            f"past the end of the {size}-byte file")
    return GGUFHeader(version=version, metadata_keys=tuple(keys), tensors=tuple(tensors),
                      data_start=data_start, data_bytes=expected)


__all__ = ["GGML_TYPES", "GGUFHeader", "GGUFTensor", "MalformedGGUF", "parse_gguf"]
