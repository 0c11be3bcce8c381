"""Writing the payload: distinct blobs, checked against their pins, split into parts.

Each source is read once into a reused buffer; the SHA-256 (and, for regular model files, the
git blob SHA-1) of the bytes actually written must equal the pin, so what is packed is exactly
what was pinned even if the source changes underneath. With compression on, each blob is first
zlib-encoded into a scratch file and kept encoded only if that saves at least 5 %; a blob whose
first 16 MiB do not shrink (model weights) is abandoned early and stored as is.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import threading
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from airgap import paths
from airgap.bundle import Blob, ContentFile, Part
from airgap.errors import AirgapError, Code, fail
from airgap.space import writing
from airgap.stream import CHUNK_BYTES, Progress
from clishell import WAKE_S, wait_for, wait_out

#: Keep a zlib encoding only when it is at most this fraction of the content size.
WORTH_IT = 0.95
#: Give up compressing a blob whose first this-many bytes do not shrink.
PROBE_BYTES = 16 * 1024**2


@dataclass(frozen=True)
class Source:
    """One content file to pack: where its bytes are and what they must be."""

    file: ContentFile
    origin: Path
    git_sha1: str | None  # checked too for regular (non-LFS) model files


class PartWriter:
    """Writes the payload stream into parts of at most ``part_size`` bytes, hashing each.

    Writing and part hashing run in a background thread (fed through a small bounded queue of
    chunk copies, at most ``QUEUE_CHUNKS x CHUNK_BYTES`` of memory) while the caller reads and
    hashes the content, so the two SHA-256 passes of packing use two cores. Parts get their
    final names (``payload.000-of-NNN``) in ``finish``, once their count is known (with
    compression it is not known in advance).
    """

    QUEUE_CHUNKS = 4

    def __init__(self, directory: Path, part_size: int) -> None:
        self.directory, self.part_size = directory, part_size
        self.position = 0  # bytes submitted to the payload so far
        self._parts: list[Part] = []
        self._fh: BinaryIO | None = None
        self._hash = hashlib.sha256()
        self._written = 0  # in the current part
        self._offset = 0  # of the current part
        self._queue: queue.Queue[bytes | None] = queue.Queue(self.QUEUE_CHUNKS)
        self._error: BaseException | None = None
        # Set when the thread ends. Waited on instead of Thread.join: on Python 3.11 a signal
        # that interrupts join() marks the thread stopped while it still runs (bpo-45274), and
        # cleanup would then race with its writes.
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="airgap-part-writer", daemon=True)
        self._thread.start()

    def _temp_name(self, i: int) -> Path:
        return self.directory / f".part-{i}"

    def write(self, data: memoryview) -> None:
        """Append ``data`` to the payload (copied; the caller may reuse its buffer)."""
        if self._error is not None:
            raise self._error
        self._queue.put(bytes(data))
        self.position += len(data)

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                if self._error is None:
                    self._write_sync(memoryview(item))
            if self._fh is not None and self._error is None:
                with writing(self._temp_name(len(self._parts))):
                    self._close_part()  # the last, partial part
        except BaseException as exc:
            self._error = exc
            while self._queue.get() is not None:  # drain so the producer never blocks
                pass
        finally:
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            self._done.set()

    def _write_sync(self, data: memoryview) -> None:
        while data:
            path = self._temp_name(len(self._parts))
            with writing(path):
                if self._fh is None:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    self._fh = os.fdopen(fd, "wb", buffering=0)
                chunk = data[: self.part_size - self._written]
                self._fh.write(chunk)
                self._hash.update(chunk)
                self._written += len(chunk)
                data = data[len(chunk) :]
                if self._written == self.part_size:
                    self._close_part()

    def _close_part(self) -> None:
        assert self._fh is not None
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        self._parts.append(Part("", self._offset, self._written, self._hash.hexdigest()))
        self._offset += self._written
        self._hash, self._written = hashlib.sha256(), 0

    def _stop(self) -> None:
        if not self._done.is_set():
            self._queue.put(None)
        wait_for(self._done)  # wakes up to run signal handlers

    def close(self) -> None:
        """Stop the writer after a failure (``finish`` stops it normally); returns once it
        stopped, through a second Ctrl-C too (the caller then removes its directory)."""
        if not self._done.is_set():
            self._error = self._error or RuntimeError("packing aborted")
            sent = False  # the end marker: the writer discards what is queued before it
            while not sent and self._thread.is_alive():
                with contextlib.suppress(BaseException):  # queue.Full, or a later signal
                    self._queue.put(None, timeout=WAKE_S)
                    sent = True
            wait_out(self._done, self._thread.is_alive)

    def finish(self) -> tuple[Part, ...]:
        """Flush, close the last part and give every part its final name; returns the parts."""
        self._stop()
        if self._error is not None:
            raise self._error
        n = len(self._parts)
        named = []
        for i, part in enumerate(self._parts):
            name = paths.part_name(i, n)
            os.rename(self._temp_name(i), self.directory / name)
            named.append(Part(name, part.offset, part.size, part.sha256))
        return tuple(named)


class _Checker:
    """Digests of the bytes read from a source, compared with its pins at the end."""

    def __init__(self, s: Source) -> None:
        self.source = s
        self.sha256 = hashlib.sha256()
        self.sha1 = (
            hashlib.sha1(b"blob %d\0" % s.file.size, usedforsecurity=False) if s.git_sha1 else None
        )
        self.size = 0

    def update(self, chunk: memoryview) -> None:
        self.sha256.update(chunk)
        if self.sha1 is not None:
            self.sha1.update(chunk)
        self.size += len(chunk)
        if self.size > self.source.file.size:
            self.check()

    def check(self) -> None:
        """Raise ``pin_mismatch`` unless size and digests equal the pins."""
        f, origin = self.source.file, self.source.origin
        if self.size != f.size:
            raise fail(Code.PIN_MISMATCH, f"{f.label}: {origin} changed size while packed",
                       path=f.label, expected=str(f.size), actual=str(self.size))  # fmt: skip
        digest = self.sha256.hexdigest()
        if digest != f.sha256:
            raise fail(Code.PIN_MISMATCH,
                       f"{f.label}: {origin} does not match the pinned sha256; refusing to pack",
                       path=f.label, expected=f.sha256, actual=digest)  # fmt: skip
        if self.sha1 is not None and self.sha1.hexdigest() != self.source.git_sha1:
            raise fail(Code.PIN_MISMATCH, f"{f.label}: git blob SHA-1 differs from the pin",
                       path=f.label, expected=self.source.git_sha1,
                       actual=self.sha1.hexdigest())  # fmt: skip


def _read(s: Source, view: memoryview) -> Iterable[memoryview]:
    try:
        with open(s.origin, "rb", buffering=0) as fh:
            while n := fh.readinto(view):
                yield view[:n]
    except OSError as exc:
        raise AirgapError(Code.IO_ERROR, f"cannot read {s.origin}: {exc}") from exc


def write_blobs(
    directory: Path,
    sources: Iterable[Source],
    part_size: int,
    *,
    compress: bool = False,
    progress: Progress | None = None,
) -> tuple[list[Blob], tuple[Part, ...]]:
    """Write each distinct content once into the payload parts under ``directory``.

    Returns:
        (blobs in payload order, parts).

    Raises:
        VerificationFailed: ``pin_mismatch`` if a source's bytes differ from its pins.
        AirgapError: ``io_error``.
    """
    unique: dict[str, Source] = {}
    for s in sources:
        unique.setdefault(s.file.sha256, s)
    writer = PartWriter(directory, part_size)
    view = memoryview(bytearray(CHUNK_BYTES))
    blobs: list[Blob] = []
    try:
        for s in unique.values():
            offset = writer.position
            encoded = _zlib_encode(s, directory, view, progress) if compress else None
            if encoded is None:
                checker = _Checker(s)
                for chunk in _read(s, view):
                    checker.update(chunk)
                    writer.write(chunk)
                    if progress is not None:
                        progress(len(chunk))
                checker.check()
                blobs.append(Blob(s.file.sha256, s.file.size, offset, s.file.size))
                continue
            with open(encoded, "rb", buffering=0) as fh:
                while n := fh.readinto(view):
                    writer.write(view[:n])
            encoded.unlink()
            stored = writer.position - offset
            blobs.append(Blob(s.file.sha256, s.file.size, offset, stored, "zlib"))
        parts = writer.finish()
    except BaseException:  # also an interrupt while finishing: stop the writer thread first
        writer.close()
        raise
    return blobs, parts


def _zlib_encode(
    s: Source, directory: Path, view: memoryview, progress: Progress | None
) -> Path | None:
    """zlib-encode a source into a scratch file; None if that does not save enough."""
    scratch = directory / f".zlib-{s.file.sha256}"
    checker = _Checker(s)
    comp = zlib.compressobj(6)
    stored = 0
    with writing(scratch), open(scratch, "wb") as out:
        for chunk in _read(s, view):
            checker.update(chunk)
            stored += out.write(comp.compress(chunk))
            if progress is not None:
                progress(len(chunk))
            if checker.size >= PROBE_BYTES and stored > WORTH_IT * checker.size:
                break  # incompressible (weights): store it as is
        else:
            stored += out.write(comp.flush())
            checker.check()
            if stored <= WORTH_IT * s.file.size:
                return scratch
    if progress is not None:
        progress(-checker.size)  # the identity copy reads it again
    scratch.unlink()
    return None
