"""File digests as the Hugging Face Hub defines them.

* sha256 of the content: the identity of LFS files (``lfs.sha256``, ``X-Linked-Etag``).
* git blob SHA-1: ``sha1(b"blob " + str(len).encode() + b"\\0" + content)``, the identity of
  regular (non-LFS) files (``ETag``), as defined by git's object format.

Both are computed in one streaming pass so a file is read once.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from weights.errors import WeightsError

#: Read size for streaming digests, in bytes (4 MiB: within the 1-8 MiB sweet spot for hashlib).
CHUNK_BYTES = 4 * 1024 * 1024

ProgressCallback = Callable[[int], None]
"""Called with the number of bytes just read (for progress bars)."""


@dataclass(frozen=True)
class FileDigests:
    """Size and digests of one file.

    Attributes:
        size: Size in bytes.
        sha256: Lower-case hex SHA-256 of the content (64 characters).
        git_sha1: Lower-case hex git blob SHA-1 (40 characters).
    """

    size: int
    sha256: str
    git_sha1: str


def _open(path: Path) -> tuple[int, BinaryIO]:
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise WeightsError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return os.fstat(fh.fileno()).st_size, fh


def digest_file(
    path: str | os.PathLike[str], progress: ProgressCallback | None = None
) -> FileDigests:
    """Compute size, sha256 and git blob SHA-1 of a file in one streaming pass.

    Args:
        path: File to read (symlinks are followed).
        progress: Optional callback receiving the byte count of each chunk read.

    Returns:
        The file's :class:`FileDigests`.

    Raises:
        WeightsError: The file cannot be read, or changed size while being read.
    """
    p = Path(path)
    size, fh = _open(p)
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
    read = 0
    with fh:
        while chunk := fh.read(CHUNK_BYTES):
            sha256.update(chunk)
            sha1.update(chunk)
            read += len(chunk)
            if progress is not None:
                progress(len(chunk))
    if read != size:
        raise WeightsError(f"{p} changed size while it was being read ({size} -> {read} bytes)")
    return FileDigests(size=size, sha256=sha256.hexdigest(), git_sha1=sha1.hexdigest())


def sha256_file(
    path: str | os.PathLike[str], progress: ProgressCallback | None = None
) -> str:
    """Return the lower-case hex SHA-256 of a file, read in 4 MiB chunks.

    Args:
        path: File to read (symlinks are followed).
        progress: Optional callback receiving the byte count of each chunk read.

    Raises:
        WeightsError: The file cannot be read.
    """
    p = Path(path)
    _, fh = _open(p)
    digest = hashlib.sha256()
    with fh:
        while chunk := fh.read(CHUNK_BYTES):
            digest.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return digest.hexdigest()


def git_blob_sha1(path: str | os.PathLike[str]) -> str:
    """Return the git blob SHA-1 of a file (the Hub's ``ETag`` for regular files).

    Raises:
        WeightsError: The file cannot be read.
    """
    return digest_file(path).git_sha1


def git_blob_sha1_bytes(data: bytes) -> str:
    """Return the git blob SHA-1 of an in-memory byte string."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
