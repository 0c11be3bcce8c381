"""A strict safetensors header parser: a file is safetensors only if it parses this way.

The rules follow the reference implementation (huggingface/safetensors, ``Metadata`` and
``validate`` in ``safetensors/src/tensor.rs``, 0.7):

* 8-byte little-endian header length ``n``; ``n`` at most 100,000,000 and ``8 + n`` at most
  the file size; the header is UTF-8 JSON starting with ``{`` (the specification's rule),
  optionally padded with whitespace after its closing brace;
* a JSON object of ``name -> {"dtype", "shape", "data_offsets"}`` and an optional
  ``"__metadata__"`` object of strings; dtypes from the specification's list; shape and offsets
  non-negative integers below 2**64;
* sorted by offsets, the tensors tile the data buffer exactly: each begins where the previous
  ended, ``end >= begin``, ``end - begin`` equals elements x dtype bits / 8 (no overflow past
  2**64, whole bytes), and the last ends at the end of the file.

Stricter than the library, on purpose (two readers must never see different tensors): a
duplicated name is refused (the library keeps the last one), and so is a tensor entry holding
a nested object or longer than :data:`MAX_ENTRY_CHARS`.

Memory is bounded by the header: the parser never builds the JSON tree at once. Each tensor
entry is decoded alone (at most :data:`MAX_ENTRY_CHARS`) and kept as a compact
:class:`TensorEntry`; metadata holds at most :data:`MAX_METADATA_ENTRIES` strings. Measured
on a 30 MB header of 450,000 one-byte tensors (the worst shape that is valid): peak 5.8x the
header (``json.loads`` alone: 9.4x); nested or oversized values are refused at about 2x.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

from weights.errors import WeightsError

#: Largest header the reference implementation reads, in bytes (``MAX_HEADER_SIZE``).
MAX_HEADER_BYTES = 100_000_000
#: Longest JSON text of one tensor entry, in characters (a rank-100 shape fits).
MAX_ENTRY_CHARS = 8192
#: Most ``__metadata__`` entries (real files carry a handful; tiny entries cost ~10x their
#: text in Python objects).
MAX_METADATA_ENTRIES = 65536
_USIZE_MAX = 2**64 - 1

#: Bits per element of every safetensors dtype (specification, ``Dtype::bitsize``).
DTYPE_BITS: Mapping[str, int] = {
    "BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
    "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32,
    "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64,
}

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class MalformedSafetensors(WeightsError):
    """A file is not a well-formed safetensors file (what the reference loader would refuse).

    Attributes:
        path: The file as named in messages (set by the caller), or None.
    """

    code = "malformed_safetensors"

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message, hint="re-export the weights with the safetensors library")
        self.path = path


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor of a safetensors header.

    Attributes:
        name: Tensor name.
        dtype: Safetensors dtype (``BF16``, ``F8_E4M3`` ...).
        shape: Dimensions (elements).
        begin: First byte of its data, relative to the data buffer (after the header).
        end: One past its last byte, relative to the data buffer.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def elements(self) -> int:
        """Number of elements (product of the shape; 1 for a scalar)."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated safetensors header.

    Attributes:
        header_bytes: The header length ``n`` (bytes after the 8-byte prefix).
        tensors: Every tensor, in data order.
        metadata: The ``__metadata__`` strings, or None when absent.
    """

    header_bytes: int
    tensors: tuple[TensorEntry, ...]
    metadata: Mapping[str, str] | None

    def params_by_dtype(self) -> dict[str, int]:
        """Element counts by dtype."""
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.dtype] = out.get(t.dtype, 0) + t.elements
        return out


def looks_like_safetensors(head: bytes, size: int) -> bool:
    """True if the first bytes claim safetensors (a plausible length then ``{``): such a file
    must then pass :func:`parse_safetensors` to be called safetensors."""
    if len(head) < 9 or head[8:9] != b"{":
        return False
    n = int.from_bytes(head[:8], "little")
    return 2 <= n <= size - 8


def _fail(msg: str) -> MalformedSafetensors:
    return MalformedSafetensors(f"not a valid safetensors file: {msg}")


def _uint(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= _USIZE_MAX:
        raise _fail(f"{what} is {value!r}, not an integer in 0..2**64-1")
    return value


def _entry(name: str, value: Any) -> TensorEntry:
    if not isinstance(value, dict):
        raise _fail(f"tensor {name!r} is not an object")
    dtype, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise _fail(f"tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list):
        raise _fail(f"tensor {name!r} has no shape list")
    dims = tuple(_uint(d, f"tensor {name!r} dimension") for d in shape)
    if not isinstance(offsets, list) or len(offsets) != 2:
        raise _fail(f"tensor {name!r} data_offsets is not [begin, end]")
    begin = _uint(offsets[0], f"tensor {name!r} begin offset")
    end = _uint(offsets[1], f"tensor {name!r} end offset")
    return TensorEntry(name=name, dtype=dtype, shape=dims, begin=begin, end=end)


def _string(text: str, pos: int, what: str) -> tuple[str, int]:
    if text[pos:pos + 1] != '"':
        raise _fail(f"expected a string ({what}) at header byte {pos}")
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except ValueError as exc:
        raise _fail(f"bad string ({what}) at header byte {pos}: {exc}") from exc
    return str(value), end


def _skip(text: str, pos: int) -> int:
    m = _WS.match(text, pos)
    return m.end() if m else pos


def _metadata(text: str, pos: int) -> tuple[dict[str, str], int]:
    """Parse ``{"k": "v", ...}`` at ``pos`` (strings only, no duplicates)."""
    if text[pos:pos + 1] != "{":
        raise _fail("__metadata__ is not an object of strings")
    out: dict[str, str] = {}
    pos = _skip(text, pos + 1)
    if text[pos:pos + 1] == "}":
        return out, pos + 1
    while True:
        key, pos = _string(text, _skip(text, pos), "metadata key")
        pos = _skip(text, pos)
        if text[pos:pos + 1] != ":":
            raise _fail(f"expected ':' at header byte {pos}")
        value, pos = _string(text, _skip(text, pos + 1), f"metadata value of {key!r}")
        if key in out:
            raise _fail(f"metadata key {key!r} appears twice")
        if len(out) >= MAX_METADATA_ENTRIES:
            raise _fail(f"more than {MAX_METADATA_ENTRIES} metadata entries")
        out[key] = value
        pos = _skip(text, pos)
        sep = text[pos:pos + 1]
        if sep == "}":
            return out, pos + 1
        if sep != ",":
            raise _fail(f"expected ',' or '}}' at header byte {pos}")
        pos += 1


def _tensor_value(text: str, pos: int, name: str) -> tuple[TensorEntry, int]:
    if text[pos:pos + 1] != "{":
        raise _fail(f"tensor {name!r} is not an object")
    close = text.find("}", pos, pos + MAX_ENTRY_CHARS + 1)
    if close < 0:
        raise _fail(f"tensor {name!r}: entry longer than {MAX_ENTRY_CHARS} characters "
                    "or unterminated")
    try:
        value, end = _DECODER.raw_decode(text[pos:close + 1])
    except ValueError as exc:
        raise _fail(f"tensor {name!r}: bad entry ({exc})") from exc
    if end != close + 1 - pos:
        raise _fail(f"tensor {name!r}: bad entry")
    return _entry(name, value), close + 1


def _parse_text(text: str) -> tuple[list[TensorEntry], dict[str, str] | None]:
    if not text.startswith("{"):
        raise _fail("the header does not start with '{'")
    tensors: list[TensorEntry] = []
    names: set[str] = set()
    metadata: dict[str, str] | None = None
    pos = _skip(text, 1)
    if text[pos:pos + 1] == "}":
        pos += 1
    else:
        while True:
            key, pos = _string(text, _skip(text, pos), "tensor name")
            pos = _skip(text, pos)
            if text[pos:pos + 1] != ":":
                raise _fail(f"expected ':' at header byte {pos}")
            pos = _skip(text, pos + 1)
            if key in names or (key == "__metadata__" and metadata is not None):
                raise _fail(f"{key!r} appears twice in the header")
            if key == "__metadata__":
                metadata, pos = _metadata(text, pos)
            else:
                names.add(key)
                entry, pos = _tensor_value(text, pos, key)
                tensors.append(entry)
            pos = _skip(text, pos)
            sep = text[pos:pos + 1]
            if sep == "}":
                pos += 1
                break
            if sep != ",":
                raise _fail(f"expected ',' or '}}' at header byte {pos}")
            pos += 1
    if _skip(text, pos) != len(text):
        raise _fail(f"bytes after the header's closing brace (at header byte {pos})")
    return tensors, metadata


def _validate(tensors: list[TensorEntry], buffer_len: int) -> tuple[TensorEntry, ...]:
    ordered = sorted(tensors, key=lambda t: (t.begin, t.end))
    start = 0
    for t in ordered:
        if t.begin != start or t.end < t.begin:
            raise _fail(f"tensor {t.name!r} has offsets [{t.begin}, {t.end}] where {start} "
                        "was expected (overlap, hole or reversed)")
        bits = t.elements * DTYPE_BITS[t.dtype]
        if t.elements > _USIZE_MAX or bits > _USIZE_MAX:
            raise _fail(f"tensor {t.name!r}: shape {list(t.shape)} overflows")
        if bits % 8:
            raise _fail(f"tensor {t.name!r}: {t.elements} x {t.dtype} is not whole bytes")
        if t.end - t.begin != bits // 8:
            raise _fail(f"tensor {t.name!r}: {t.end - t.begin} bytes for shape "
                        f"{list(t.shape)} of {t.dtype} ({bits // 8} expected)")
        start = t.end
    if start != buffer_len:
        raise _fail(f"the tensors cover {start} of the {buffer_len} data bytes")
    return tuple(ordered)


def parse_safetensors(fh: BinaryIO, size: int) -> SafetensorsHeader:
    """Parse and validate a local safetensors file's header against its size.

    Args:
        fh: The file, positioned at 0 (left positioned after the header).
        size: The file size in bytes.

    Returns:
        The validated header.

    Raises:
        MalformedSafetensors: See :func:`read_safetensors_header`.
        OSError: The file cannot be read.
    """
    return read_safetensors_header(fh.read, size)


def read_safetensors_header(read: Callable[[int], bytes], size: int) -> SafetensorsHeader:
    """Parse and validate a safetensors header read from the file's start (local or ranged).

    Args:
        read: ``read(n) -> bytes``: the next ``n`` bytes of the file (8, then the header).
        size: The whole file's size in bytes (the tensors must cover it exactly).

    Returns:
        The validated header.

    Raises:
        MalformedSafetensors: Anything the reference loader refuses (see the module docstring),
            and duplicated names or oversized tensor entries.
        OSError: The file cannot be read.
    """
    prefix = read(8)
    if len(prefix) != 8:
        raise _fail("shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", prefix)
    if n > MAX_HEADER_BYTES:
        raise _fail(f"header of {n} bytes exceeds {MAX_HEADER_BYTES}")
    if 8 + n > size:
        raise _fail(f"header length {n} runs past the end of the {size}-byte file")
    raw = read(n)
    if len(raw) != n:
        raise _fail("header truncated")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(f"header is not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    del raw
    tensors, metadata = _parse_text(text)
    return SafetensorsHeader(header_bytes=n, tensors=_validate(tensors, size - 8 - n),
                             metadata=metadata)


__all__ = [
    "DTYPE_BITS",
    "MAX_HEADER_BYTES",
    "MalformedSafetensors",
    "SafetensorsHeader",
    "TensorEntry",
    "looks_like_safetensors",
    "parse_safetensors",
    "read_safetensors_header",
]
