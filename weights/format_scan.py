"""What a model file is, by content and by name, and what its pickles import.

:func:`inspect_file` finds a file's format (``safetensors`` and ``gguf`` only after a full
parse, ``pickle`` by content, by name, as a NumPy array of objects or inside an archive, else
``data``) and scans what is pickle-based with :mod:`weights.pickle_scan` (nothing is
unpickled). :mod:`weights.serialisation` applies the policy to the verdict; the rules a file
is judged by are in its docstring.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from weights.errors import ModelFileRefused
from weights.gguf_format import MalformedGGUF, parse_gguf
from weights.npy_format import MAGIC as NPY_MAGIC
from weights.npy_format import read_npy_header
from weights.pickle_scan import NotAPickle, PickleVerdict, is_pickle, scan_pickle_stream
from weights.safetensors_format import (
    MalformedSafetensors,
    looks_like_safetensors,
    parse_safetensors,
)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib")
#: Nesting depth of archives inside archives that is still scanned; deeper is refused.
MAX_ARCHIVE_DEPTH = 3
#: Largest archive member read into memory for scanning, in bytes (pickles inside torch
#: archives are small: tensor data lives in separate members).
MAX_MEMBER_BYTES = 256 * 1024**2


def named_as_pickle(path: str) -> bool:
    """True if the file name has a pickle-based extension (case-insensitive)."""
    return path.lower().endswith(PICKLE_SUFFIXES)


def sniff(fh: BinaryIO, size: int) -> str:
    """Return the format of a file by content: ``pickle``, ``safetensors``, ``gguf``, ``npy``,
    ``zip`` or ``data``. ``fh`` is positioned at 0 and left there.

    Anything a pickle loader would execute is a ``pickle`` first, whatever header it also
    carries (``G\\0\\0\\0\\0\\0\\0\\0{`` reads as a safetensors length and, to the
    unpickler, as a float followed by a payload; ``GGUF`` + 5 bytes likewise). Safetensors and
    GGUF are then decided by a full parse (:func:`parse_safetensors`, :func:`parse_gguf`): a
    header that only looks right is ``data``.
    """
    try:
        if is_pickle(fh, size):
            return "pickle"
        head = fh.read(16)
        fh.seek(0)
        if head[:4] == b"GGUF":
            return "gguf" if _parses(parse_gguf, fh, size) else "data"
        if looks_like_safetensors(head, size):
            return "safetensors" if _parses(parse_safetensors, fh, size) else "data"
        if head[:6] == NPY_MAGIC:
            return "npy"
        if head[:4] == b"PK\x03\x04":
            return "zip"
        return "data"
    finally:
        fh.seek(0)


def _parses(parse: Callable[[BinaryIO, int], object], fh: BinaryIO, size: int) -> bool:
    try:
        parse(fh, size)
    except (MalformedSafetensors, MalformedGGUF):
        return False
    finally:
        fh.seek(0)
    return True


def _npy_pickle(fh: BinaryIO, size: int, label: str) -> PickleVerdict | None:
    """The pickle inside an ``.npy`` of objects (None for a plain numeric array)."""
    header = read_npy_header(fh)
    if header is None or not header.holds_objects:
        return None
    fh.seek(header.data_offset)
    try:
        return scan_pickle_stream(fh, max(0, size - header.data_offset))
    except NotAPickle:
        return _pickle_verdict([], [f"{label}: NumPy array of objects whose data is not a "
                                    "pickle"], 0)
    finally:
        fh.seek(0)


def _scan_zip(data: BinaryIO, label: str, depth: int) -> tuple[bool, list[str], list[str]]:
    """Scan an archive: (holds pickles, globals, findings).

    Raises:
        ModelFileRefused: ``archive_too_deep`` (archives nested deeper than
            :data:`MAX_ARCHIVE_DEPTH`), ``encrypted_archive`` (a member needs a password: its
            content cannot be inspected).
    """
    if depth > MAX_ARCHIVE_DEPTH:
        raise ModelFileRefused(
            f"{label}: archives nested deeper than {MAX_ARCHIVE_DEPTH} cannot be inspected",
            path=label, code="archive_too_deep", hint="unpack the inner archive first")
    try:
        zf = zipfile.ZipFile(data)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return True, [], [f"{label}: unreadable zip archive ({exc})"]
    has_pickle = False
    found: list[str] = []
    findings: list[str] = []
    with zf:
        for info in zf.infolist():
            where = f"{label}!{info.filename}"
            if info.is_dir():
                continue
            if info.flag_bits & 0x1:
                raise ModelFileRefused(
                    f"{where}: encrypted archive member cannot be inspected",
                    path=label, code="encrypted_archive",
                    hint="ship the member unencrypted (loaders cannot read it either)")
            if info.file_size > MAX_MEMBER_BYTES and not info.filename.endswith(".pkl"):
                continue  # tensor storage: the loader never unpickles it
            if info.file_size > MAX_MEMBER_BYTES:
                return True, found, [*findings, f"{where}: pickle larger than the scan limit"]
            try:
                member = zf.read(info)
            except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError,
                    RuntimeError) as exc:
                return True, found, [*findings, f"{where}: unreadable member ({exc})"]
            buf = io.BytesIO(member)
            kind = sniff(buf, len(member))
            if kind == "zip":
                nested, g, f = _scan_zip(buf, where, depth + 1)
                has_pickle |= nested
                found += g
                findings += f
            elif kind == "npy":
                verdict = _npy_pickle(buf, len(member), where)
                if verdict is not None:
                    has_pickle = True
                    found += verdict.globals
                    findings += [f"{where}: {x}" for x in verdict.findings]
            elif kind == "pickle" or info.filename.endswith(".pkl"):
                has_pickle = True
                try:
                    v = scan_pickle_stream(buf, len(member))
                except NotAPickle as exc:
                    findings.append(f"{where}: named .pkl but not a pickle ({exc})")
                    continue
                found += v.globals
                findings += [f"{where}: {x}" for x in v.findings]
    return has_pickle, found, findings


def _pickle_verdict(found: Iterable[str], findings: list[str], pickles: int) -> PickleVerdict:
    return PickleVerdict(safe=not findings, globals=tuple(sorted(set(found))),
                         findings=tuple(findings), pickles=pickles)


def inspect_file(path: Path, label: str) -> tuple[str, PickleVerdict | None]:
    """Find the format of ``path`` and scan it if it is pickle-based (never unpickles).

    Returns:
        (format, verdict): verdict is None unless format is ``pickle``. Formats:
        ``safetensors``, ``gguf`` (each only after a full parse), ``pickle`` (by content,
        by name, a NumPy array of objects, or an archive holding one), ``data``.

    Raises:
        ModelFileRefused: An encrypted archive member (``encrypted_archive``), archives
            nested too deep (``archive_too_deep``).
        OSError: The file cannot be read.
    """
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        kind = sniff(fh, size)
        if kind in ("safetensors", "gguf"):
            return kind, None
        if kind == "npy":
            npy = _npy_pickle(fh, size, label)
            if npy is not None:
                return "pickle", npy
            return ("pickle", _pickle_verdict([], [f"{label}: named as a pickle but a "
                                                   "NumPy array"], 0)) \
                if named_as_pickle(label) else ("data", None)
        if kind == "zip":
            has_pickle, found, findings = _scan_zip(fh, label, 1)
            if has_pickle or named_as_pickle(label):
                if not has_pickle:
                    findings.append(f"{label}: pickle-named archive without a pickle")
                return "pickle", _pickle_verdict(found, findings, 0)
            return "data", None
        if kind == "pickle":
            return "pickle", scan_pickle_stream(fh, size)
        if named_as_pickle(label):
            return "pickle", _pickle_verdict(
                [], [f"{label}: named as a pickle but neither a pickle nor safetensors/GGUF"], 0)
        return "data", None


__all__ = [
    "MAX_ARCHIVE_DEPTH",
    "MAX_MEMBER_BYTES",
    "PICKLE_SUFFIXES",
    "inspect_file",
    "named_as_pickle",
    "sniff",
]
