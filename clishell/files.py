"""Output files that are complete or absent: what a command writes is never left half-written.

A command can be stopped at any point (Ctrl-C, SIGTERM: :mod:`clishell.interrupt` turns both
into an exception) or fail half-way (disk full). :func:`atomic_file` writes into a temporary
file in the target's directory and publishes it under its name only when the writing finished
(``os.replace``: readers see the old file or the new one; with ``exclusive``, ``os.link``: the
name is taken only if free, so an existing key file is never overwritten). On any exception,
``Interrupted`` included, the temporary file is removed and nothing changed.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["atomic_file", "write_atomic"]


@contextmanager
def atomic_file(path: Path, *, exclusive: bool = False, private: bool = False,
                encoding: str = "utf-8") -> Iterator[IO[str]]:
    """A text file to write that appears as ``path`` only once the block ends without error.

    Args:
        path: The file to create or replace.
        exclusive: Refuse to replace an existing ``path`` (``FileExistsError`` at the end of
            the block, nothing written), as ``open(path, "x")`` would.
        private: Mode 0600 (a private key); otherwise what ``open`` gives: 0666 & ~umask.
        encoding: The text encoding.

    Yields:
        The open temporary file.

    Raises:
        FileExistsError: ``exclusive`` and ``path`` exists.
        OSError: The directory cannot be written.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial",
                               dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "w", encoding=encoding) as fh:
            if not private:  # mkstemp's 0600, widened to what a plain open() would create
                mask = os.umask(0o077)  # read it; restrictive meanwhile
                os.umask(mask)
                os.fchmod(fh.fileno(), 0o666 & ~mask)
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        if exclusive:
            os.link(tmp, path)  # fails if the name is taken: never overwrites
        else:
            os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_atomic(path: Path, text: str, *, exclusive: bool = False,
                 private: bool = False) -> None:
    """Write ``text`` to ``path`` completely or not at all (see :func:`atomic_file`).

    Raises:
        FileExistsError: ``exclusive`` and ``path`` exists.
        OSError: The file cannot be written.
    """
    with atomic_file(path, exclusive=exclusive, private=private) as fh:
        fh.write(text)
