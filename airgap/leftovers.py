"""Work directories of running and of killed runs: hold one, find the others' remains.

``pack`` builds a bundle in ``.<out>.<random>.partial`` beside its output and ``unpack`` stages
blobs in ``STORE/.airgap-staging-<random>``; both remove them on success, failure and on
SIGINT/SIGTERM/SIGHUP, but not after SIGKILL, a power cut or the OOM killer. Each run holds an
exclusive ``flock`` on its own directory while it works, so the next run can tell a dead run's
directory (lock free) from a concurrent run's (lock held) and only touches the former: unpack
resumes from the blobs it finds there (after hashing them again), pack removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def held(directory: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``directory`` (a run's own work directory) while inside."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)  # releases the lock


def dead(parent: Path, pattern: str) -> list[Path]:
    """Directories under ``parent`` matching the glob ``pattern`` whose run is gone.

    A directory whose lock another process holds belongs to a running command and is left
    out; symlinks and non-directories are never returned.
    """
    found: list[Path] = []
    for path in sorted(parent.glob(pattern)):
        if path.is_symlink() or not path.is_dir():
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live run's
        finally:
            os.close(fd)
        found.append(path)
    return found
