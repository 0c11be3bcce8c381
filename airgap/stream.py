"""Streaming SHA-256 of payload ranges, in parallel threads with constant memory.

Each worker thread owns one reusable buffer (``CHUNK_BYTES``) and reads with ``os.preadv``
straight into it, so memory is ``workers x CHUNK_BYTES`` whatever the bundle size; hashlib
releases the GIL on buffers over 2 KiB, so threads hash on separate cores.
"""

from __future__ import annotations

import hashlib
import os
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from airgap.bundle import Index, Segment
from airgap.errors import Code, Problem, VerificationFailed
from airgap.media import open_part
from clishell import wait_for, wait_out

#: Read size in bytes: large enough to amortise syscalls, small enough to stay in L2/L3 reach.
CHUNK_BYTES = 4 * 1024**2

Progress = Callable[[int], None]


class Sink(Protocol):
    """Receives the bytes of one range; closed by the engine when the range is done."""

    def write(self, data: memoryview, /) -> object: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Range:
    """A payload byte range to hash: ``size`` stored bytes from ``offset``, known by ``key``.

    ``encoding`` ``zlib`` means the stored bytes are a zlib stream (RFC 1950) that must decode
    to exactly ``content_size`` bytes; the digest is then of the decoded content.
    """

    key: str
    offset: int
    size: int
    encoding: str = "identity"
    content_size: int | None = None


class _Consumer:
    """Feeds stored bytes to the hash and the sink, decoding zlib with bounded output."""

    def __init__(self, rng: Range, out: Sink | None) -> None:
        self.hash = hashlib.sha256()
        self.out = out
        self.limit = rng.content_size if rng.content_size is not None else rng.size
        self.produced = 0
        self.decoder = zlib.decompressobj() if rng.encoding == "zlib" else None

    def _emit(self, data: memoryview | bytes) -> None:
        self.produced += len(data)
        if self.produced > self.limit:
            raise ValueError(f"decodes to more than the declared {self.limit} bytes")
        self.hash.update(data)
        if self.out is not None:
            self.out.write(memoryview(data))

    def feed(self, data: memoryview) -> None:
        if self.decoder is None:
            self._emit(data)
            return
        pending: memoryview | bytes = data
        while pending:
            # max_length bounds memory and stops a decompression bomb early.
            self._emit(self.decoder.decompress(pending, CHUNK_BYTES))
            pending = self.decoder.unconsumed_tail

    def finish(self) -> str:
        if self.decoder is not None:
            self._emit(self.decoder.flush())
            if not self.decoder.eof or self.decoder.unused_data:
                raise ValueError("the zlib stream is truncated or followed by extra bytes")
        if self.produced != self.limit:
            raise ValueError(f"decodes to {self.produced} bytes, declared {self.limit}")
        return self.hash.hexdigest()


@dataclass(frozen=True)
class RangeResult:
    """The digest of a range, or why it could not be read."""

    range: Range
    sha256: str | None
    problem: Problem | None = None


def default_workers() -> int:
    """Worker threads to use: one per available core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def hash_ranges(
    bundle: Path,
    index: Index,
    ranges: Sequence[Range],
    *,
    readable: set[str],
    workers: int,
    sink: Callable[[Range], Sink] | None = None,
    progress: Progress | None = None,
) -> list[RangeResult]:
    """Hash payload ranges from the parts, in parallel.

    Args:
        bundle: the bundle directory.
        index: the validated index (gives the part layout).
        ranges: the ranges to hash (blobs or whole parts).
        readable: names of parts that passed ``check_parts``; a range touching any other part
            is reported ``content_unreadable`` without reading.
        workers: number of threads (1 = hash in the calling thread).
        sink: optional function giving, per range, a binary file to receive the bytes
            (``unpack`` stages blobs with it); None to only hash.
        progress: called with the number of bytes just processed (from worker threads).

    Returns:
        one result per range, in the order of ``ranges``.
    """
    order = sorted(range(len(ranges)), key=lambda i: -ranges[i].size)
    results: list[RangeResult | None] = [None] * len(ranges)
    lock = threading.Lock()
    cursor = iter(order)
    errors: list[BaseException] = []

    def tick(n: int) -> None:  # per chunk read, in the worker
        if errors:  # another worker failed or the caller was interrupted: stop mid-range
            raise _Stopped
        if progress is not None:
            progress(n)

    def work(done: threading.Event | None = None) -> None:
        buf = bytearray(CHUNK_BYTES)
        view = memoryview(buf)
        fds: dict[str, int] = {}
        try:
            while True:
                with lock:
                    i = None if errors else next(cursor, None)  # stop early after a failure
                if i is None:
                    return
                out = sink(ranges[i]) if sink else None
                try:
                    results[i] = _hash_one(bundle, index, ranges[i], readable, view, fds, out,
                                           tick)  # fmt: skip
                finally:
                    if out is not None:
                        out.close()
        except BaseException as exc:  # surfaced in the calling thread
            errors.append(exc)
        finally:
            for fd in fds.values():
                os.close(fd)
            if done is not None:
                done.set()

    n = max(1, min(workers, len(ranges)))
    if n == 1:
        work()
    else:
        # Waited on through events, not Thread.join (see clishell.wait_for).
        finished = [threading.Event() for _ in range(n)]
        threads = [threading.Thread(target=work, args=(done,), name=f"airgap-hash-{k}")
                   for k, done in enumerate(finished)]
        try:
            for t in threads:
                t.start()  # a signal may interrupt it: the worker may run already
            for done in finished:
                wait_for(done)  # wakes up to run signal handlers
        except BaseException as exc:  # interrupted: workers stop before their next range
            errors.append(exc)
            # Every worker running now stops (at its next chunk) before the caller cleans up
            # (a worker still writing into a staging directory while it was removed left it
            # behind); one not yet running sees the error first and writes nothing.
            for t, done in zip(threads, finished, strict=True):
                wait_out(done, t.is_alive)  # through a second Ctrl-C: a chunk, 4 MiB at most
            raise
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


class _Stopped(Exception):
    """Raised in a worker at its next chunk once the hashing failed or was interrupted."""


def _hash_one(
    bundle: Path,
    index: Index,
    rng: Range,
    readable: set[str],
    view: memoryview,
    fds: dict[str, int],
    out: Sink | None,
    progress: Progress | None,
) -> RangeResult:
    segments = list(index.segments(rng.offset, rng.size))
    bad = [s.part.name for s in segments if s.part.name not in readable]
    if bad:
        return RangeResult(rng, None, Problem(
            Code.CONTENT_UNREADABLE, f"cannot be checked: it lies in damaged part(s) "
            f"{', '.join(bad)}", part=bad[0], path=rng.key))  # fmt: skip
    consumer = _Consumer(rng, out)
    try:
        for seg in segments:
            _hash_segment(bundle, seg, view, fds, consumer, progress)
        return RangeResult(rng, consumer.finish())
    except VerificationFailed as exc:
        return RangeResult(rng, None, exc.problems[0])
    except (ValueError, zlib.error) as exc:
        return RangeResult(rng, None, Problem(
            Code.CONTENT_DIGEST_MISMATCH, f"{rng.key}: stored bytes do not decode: {exc}",
            path=rng.key, expected=rng.key, actual="undecodable"))  # fmt: skip


def _hash_segment(
    bundle: Path,
    seg: Segment,
    view: memoryview,
    fds: dict[str, int],
    consumer: _Consumer,
    progress: Progress | None,
) -> None:
    fd = fds.get(seg.part.name)
    if fd is None:
        fd = fds[seg.part.name] = open_part(bundle, seg.part)
    pos, end = seg.start, seg.start + seg.length
    size = len(view)
    while pos < end:
        want = min(size, end - pos)
        chunk = view[:want]
        try:
            n = os.preadv(fd, [chunk], pos)
        except OSError as exc:  # bad media (EIO): a finding about this part, not a crash
            raise VerificationFailed([Problem(
                Code.CONTENT_UNREADABLE, f"part {seg.part.name} cannot be read at byte {pos}: "
                f"{exc.strerror or exc}", part=seg.part.name)]) from exc  # fmt: skip
        if n <= 0:
            raise VerificationFailed([Problem(
                Code.PART_SIZE_MISMATCH, f"part {seg.part.name} ended at byte {pos} while read",
                part=seg.part.name, expected=str(seg.part.size), actual=str(pos))])  # fmt: skip
        consumer.feed(view[:n])
        if progress is not None:
            progress(n)
        pos += n
