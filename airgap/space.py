"""Free-space and write-error reporting for the files ``pack`` and ``unpack`` create.

A multi-gigabyte copy that fails at 90 % on a full USB stick wastes the operator's time, and a
bare ``[Errno 28] No space left on device`` does not say where: both commands check the free
space of the target file system first, and report a failed write with the file and the fix.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from airgap.errors import AirgapError, Code


def require_free(target: Path, needed: int, what: str) -> None:
    """Raise ``io_error`` unless the file system holding ``target`` has ``needed`` bytes free.

    Args:
        target: a path on the target file system (the nearest existing ancestor is measured).
        needed: bytes about to be written.
        what: what is being written, for the message.

    Raises:
        AirgapError: ``io_error`` (not enough space, or the file system cannot be measured).
    """
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError as exc:
        raise AirgapError(Code.IO_ERROR, f"cannot measure free space of {probe}: "
                          f"{exc.strerror or exc}") from exc  # fmt: skip
    if needed > free:
        raise AirgapError(Code.IO_ERROR, f"{what} needs {needed} bytes, {free} free on the file "
                          f"system of {probe}; free space there or choose another target")


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an ``OSError`` while writing ``path`` into ``io_error`` naming the file."""
    try:
        yield
    except OSError as exc:
        raise AirgapError(Code.IO_ERROR, f"cannot write {path}: {exc.strerror or exc} "
                          f"(free space on that file system, or check its permissions)") from exc
