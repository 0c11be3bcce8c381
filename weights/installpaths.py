"""Where pinned files land, and the rule that no two of them land on one path.

The same lockfile (or air-gap bundle) is installed in two layouts:

* ``dir``: ``ROOT/<org>/<name>/<path>`` (``weights pull --into`` with several models,
  ``airgap unpack --layout dir``), or ``ROOT/<path>`` for one model;
* Hugging Face cache: ``ROOT/models--<org>--<name>/snapshots/<commit>/<path>`` (blobs are
  content-addressed and refs are one per entry, so they cannot collide).

Two entries collide when their install paths are equal, or when one is a directory prefix of
the other (``x`` a file and ``x/y`` another: one of them cannot be created). Names are compared
**case-insensitively and after Unicode NFC normalisation**: the default file systems of macOS
(APFS) and Windows (NTFS) and removable FAT32/exFAT media fold case, so ``README.md`` and
``readme.md`` (or ``Org/Model`` and ``org/model``) would silently become one file there; the
Hub itself treats repository ids case-insensitively. A lockfile that only installs on Linux is
not a portable pin, so such entries are refused everywhere (lock load, pin, pack, verify,
unpack). Non-normalised spellings (``a/./b``, ``a//b``, ``../x``) never reach this check: every
path is validated first (:func:`weights.lockfile.check_repo_path`).

In the cache layout two repo ids fold to the same ``models--`` folder exactly when they are
equal ignoring case: the Hub forbids ``--`` in repo ids (``a--b/c`` and ``a/b--c`` would share
``models--a--b--c``), and :func:`weights.lockfile.check_repo_id` enforces that.

The same rule holds between a lockfile and the store it is installed into: a store that holds
``models--org--tiny`` already must not get ``models--ORG--Tiny`` next to it (on Linux both
would exist and a loader would find whichever it spells; copied to a case-folding disk they
merge). :func:`existing_twin` finds such a folder before anything is written.
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path


def fold(path: str) -> str:
    """Case- and normalisation-folded form of a path (NFC, then ``str.casefold``)."""
    return unicodedata.normalize("NFC", path).casefold()


def first_collision(
    models: Sequence[tuple[str, Iterable[str]]],
) -> tuple[str, str, str] | None:
    """Find two pinned files (or models) that would install to one path.

    Args:
        models: ``(repo_id, file paths)`` per model; paths already validated as safe.

    Returns:
        None, or ``(first, second, why)`` where ``first``/``second`` are ``repo_id:path``
        labels (or repo ids) and ``why`` says how they collide.
    """
    seen_repo: dict[str, str] = {}
    for repo_id, _ in models:
        key = fold(repo_id)
        if key in seen_repo:
            return seen_repo[key], repo_id, "are one repository when case is ignored"
        seen_repo[key] = repo_id
    # The dir layout of several models: ROOT/<repo_id>/<path>. Checking these keys also covers
    # the one-model layout and the cache snapshots (both are per-model suffixes of them).
    seen: dict[str, str] = {}
    for repo_id, files in models:
        for path in files:
            key = fold(f"{repo_id}/{path}")
            label = f"{repo_id}:{path}"
            if key in seen:
                return seen[key], label, "install to the same path when case is ignored"
            seen[key] = label
    for key, label in seen.items():
        parts = key.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in seen:
                return seen[prefix], label, "collide: the first is a file and a directory " \
                    "of the second"
    return None


def existing_twin(root: Path, relative: str) -> Path | None:
    """An existing path under ``root`` that ``relative`` would land on, spelled differently.

    Walks ``relative`` (``/``-separated) component by component; where a component is not
    there under its own spelling, the directory is scanned for an entry equal to it after
    :func:`fold`. Meant for a repository's top folders (``models--org--name``, ``org/name``),
    whose parents are small; content paths inside a model are checked within the lock.

    Args:
        root: The store (cache root or plain directory).
        relative: The path that is about to be created under ``root``.

    Returns:
        The existing twin (``root/models--org--tiny`` for ``models--ORG--Tiny``), or ``None``.
    """
    current = root
    for part in relative.split("/"):
        exact = current / part
        if os.path.lexists(exact):
            current = exact
            continue
        try:
            entries = os.scandir(current)
        except (FileNotFoundError, NotADirectoryError):
            return None
        key = fold(part)
        with entries:
            for entry in entries:
                if fold(entry.name) == key:
                    return current / entry.name
        return None
    return None


__all__ = ["existing_twin", "first_collision", "fold"]
