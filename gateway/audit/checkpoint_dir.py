"""The checkpoint directory: each chain's newest signed checkpoint kept as a file outside the
store (``audit.checkpoint_dir``), so a store rolled back or forked is caught by
``gateway audit verify --checkpoints DIR``.

The writer replaces a chain's file atomically (:func:`write_checkpoint_file`: written, fsynced,
renamed, directory fsynced); verification reads every ``*.ckpt`` file
(:func:`load_checkpoint_dir`).
"""

from __future__ import annotations

import os
from pathlib import Path

from gateway.audit.errors import AuditConfigError


def checkpoint_file_name(chain: str) -> str:
    """File name of a chain's newest checkpoint inside a checkpoint directory."""
    return chain.replace("/", "_") + ".ckpt"


def write_checkpoint_file(directory: Path, chain: str, note: str) -> None:
    """Replace ``chain``'s checkpoint file in ``directory`` (made if missing) with ``note``,
    durably: the file is complete or the old one stays.

    Raises:
        OSError: The directory or the file cannot be written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_file_name(chain)
    tmp = final.with_name(final.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(note)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_checkpoint_dir(directory: Path) -> list[tuple[Path, str]]:
    """Every ``*.ckpt`` file of ``directory`` with its note, in name order.

    Raises:
        AuditConfigError: The directory does not exist or a file cannot be read.
    """
    if not directory.is_dir():
        raise AuditConfigError(f"checkpoint directory {directory} does not exist")
    out = []
    for path in sorted(directory.glob("*.ckpt")):
        try:
            out.append((path, path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise AuditConfigError(f"cannot read checkpoint {path}: {exc}") from exc
    return out
