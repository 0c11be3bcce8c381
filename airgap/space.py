"""Where the files ``pack``, ``oci-export`` and ``unpack`` create go: the output's directory,
free space, and write-error reporting.

A multi-gigabyte copy that fails at 90 % on a full USB stick wastes the operator's time, and a
bare ``[Errno 28] No space left on device`` does not say where: the commands check the free
space of the target file system first, and report a failed write with the file and the fix.
``pack --out`` and ``oci-export --out`` need the output's directory to exist, as ``cp``, ``tar``
and ``oras`` do: a typo in a mount point (``/media/usbb/...``) must not quietly become a new
directory on the root file system. (``unpack --into STORE`` creates its store, parents
included: an install target, documented in docs/airgap.md.)
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


def require_parent_dir(out: Path, option: str) -> None:
    """Raise ``io_error`` unless the directory that is to hold ``out`` exists.

    Args:
        out: the output path (a bundle or OCI layout directory to be created).
        option: the command-line option that named it, for the message (``--out``).

    Raises:
        AirgapError: ``io_error`` naming the missing (or non-directory) parent; nothing was
            created.
    """
    parent = out.parent
    if parent.is_dir():
        return
    if parent.exists() or parent.is_symlink():
        raise AirgapError(Code.IO_ERROR, f"{option} {out}: {parent} is not a directory")
    raise AirgapError(Code.IO_ERROR, f"{option} {out}: directory {parent} does not exist; "
                      "create it first (nothing is created for you: check the path)")


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn an ``OSError`` while writing ``path`` into ``io_error`` naming the file."""
    try:
        yield
    except OSError as exc:
        raise AirgapError(Code.IO_ERROR, f"cannot write {path}: {exc.strerror or exc} "
                          f"(free space on that file system, or check its permissions)") from exc
