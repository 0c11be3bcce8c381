"""NumPy ``.npy`` headers: an array of Python objects is stored as a pickle.

Format (numpy ``lib/format.py``, NEP 1): magic ``\\x93NUMPY``, major and minor version bytes,
a header length (``uint16`` for version 1, ``uint32`` for 2 and 3), then a Python dict literal
``{'descr': ..., 'fortran_order': ..., 'shape': ...}``. When the dtype holds objects (type
code ``O``, alone or inside a structured dtype), the data after the header is a pickle stream
that ``np.load(allow_pickle=True)`` unpickles. The literal is read with
:func:`ast.literal_eval` (which evaluates no code), as numpy does.
"""

from __future__ import annotations

import ast
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

MAGIC = b"\x93NUMPY"
#: Longest header numpy reads by default (``max_header_size``), in bytes.
MAX_HEADER_BYTES = 10000


@dataclass(frozen=True)
class NpyHeader:
    """What an ``.npy`` header says.

    Attributes:
        holds_objects: The dtype holds Python objects (the data is a pickle), or the dtype
            could not be understood (treated the same way: fail closed).
        data_offset: Byte offset of the data after the header.
    """

    holds_objects: bool
    data_offset: int


def _has_objects(descr: Any) -> bool:
    """True if a dtype description holds (or may hold) objects."""
    if isinstance(descr, str):
        code = descr.lstrip("<>|=")
        return code.startswith("O") or not code
    if isinstance(descr, list):  # structured: [(name, descr[, shape]), ...]
        for field in descr:
            if not isinstance(field, tuple) or len(field) not in (2, 3):
                return True
            if _has_objects(field[1]):
                return True
        return False
    return True


def read_npy_header(fh: BinaryIO) -> NpyHeader | None:
    """Read an ``.npy`` header from the current position of ``fh`` (restored afterwards).

    Returns:
        The header, or None if the bytes do not start with the ``.npy`` magic. A header that
        starts with the magic but cannot be read is reported as holding objects.
    """
    base = fh.tell()
    try:
        head = fh.read(10)
        if head[:6] != MAGIC or len(head) < 10:
            return None
        major = head[6]
        if major == 1:
            (n,) = struct.unpack("<H", head[8:10])
            offset = 10
        elif major in (2, 3):
            rest = fh.read(2)
            if len(rest) != 2:
                return NpyHeader(True, 10)
            (n,) = struct.unpack("<I", head[8:10] + rest)
            offset = 12
        else:
            return NpyHeader(True, 10)
        if n > MAX_HEADER_BYTES:
            return NpyHeader(True, offset)
        raw = fh.read(n)
        try:
            doc = ast.literal_eval(raw.decode("utf-8" if major == 3 else "latin-1"))
        except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
            return NpyHeader(True, offset + n)
        if not isinstance(doc, dict) or "descr" not in doc:
            return NpyHeader(True, offset + n)
        return NpyHeader(_has_objects(doc["descr"]), offset + n)
    finally:
        fh.seek(base)


__all__ = ["MAGIC", "NpyHeader", "read_npy_header"]
