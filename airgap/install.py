"""The atomic install of an unpack: planned files renamed into place, all or nothing.

:class:`Plan` says where every blob goes, which links and refs follow, and which directories
are built whole in staging and published with one rename (:class:`Tree`: a model directory in
the ``dir`` layout, a snapshot in ``hf-cache``); the blobs are written into a staging directory
inside the store (:class:`StagedFile`: fsynced when closed; :func:`resume` takes the blobs a
killed earlier run staged); :func:`commit` renames everything into place, refs last, and undoes
what it did, in reverse order, on any failure. A kill at any point leaves each model directory
either absent, as it was, or whole: never part-written under its final name. The checking,
planning and staging of a bundle are in :mod:`airgap.unpack`.
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from airgap import leftovers
from airgap.bundle import ContentFile
from airgap.errors import Code, StoreError
from airgap.space import writing

__all__ = ["Plan", "StagedFile", "Tree", "commit", "resume"]


@dataclass(frozen=True)
class Tree:
    """A directory built whole in staging, then published at ``final`` by one rename.

    Attributes:
        staged: the directory in staging (files and links are planned inside it).
        final: where it is published.
        replace: a directory at ``final`` (planned to be replaced) is moved aside first; if
            False, one that appeared since planning makes the publish fail (rolled back).
    """

    staged: Path
    final: Path
    replace: bool = False


@dataclass
class Plan:
    """What an install renames into place.

    Attributes:
        targets: blob sha256 -> the paths it is installed at (in the store, or inside a
            staged :class:`Tree`).
        sizes: blob sha256 -> size in bytes.
        links: (symlink, its target) pairs (hf-cache snapshots, inside a staged tree).
        trees: directories published whole, after every blob and link is in place.
        refs: (final ref file, commit) pairs, written last.
        replace: existing (damaged) files the install replaces.
    """

    targets: dict[str, list[Path]] = field(default_factory=dict)  # blob sha256 -> final paths
    sizes: dict[str, int] = field(default_factory=dict)
    links: list[tuple[Path, str]] = field(default_factory=list)  # (link, link target)
    trees: list[Tree] = field(default_factory=list)
    refs: list[tuple[Path, str]] = field(default_factory=list)  # (final ref file, commit)
    replace: set[Path] = field(default_factory=set)  # damaged files to replace

    def want(self, f: ContentFile, final: Path) -> None:
        """Install the blob of ``f`` at ``final`` (once per path)."""
        paths = self.targets.setdefault(f.sha256, [])
        if final not in paths:
            paths.append(final)
        self.sizes[f.sha256] = f.size


class StagedFile:
    """A staging file that is fsynced when closed."""

    def __init__(self, path: Path) -> None:
        """Create ``path`` (never following a symlink, never over an existing file)."""
        self.path = path
        with writing(path):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        self._fh = os.fdopen(fd, "wb", buffering=0)

    def write(self, data: memoryview) -> int:
        """Write ``data``; returns the number of bytes written."""
        with writing(self.path):
            return self._fh.write(data) or 0

    def close(self) -> None:
        """fsync, then close."""
        try:
            with writing(self.path):
                os.fsync(self._fh.fileno())
        finally:
            self._fh.close()


def resume(store: Path, staging: Path, plan: Plan,
           digest: Callable[[Path], str]) -> tuple[set[str], list[Path]]:
    """Take the needed blobs that killed earlier unpacks staged (each hashed again with
    ``digest``: a blob cut short by the kill does not match), then remove their staging
    directories (:mod:`airgap.leftovers`: only those whose lock is free).

    Returns:
        sha256 of the blobs now in ``staging`` as ``blob-<sha256>``, and the staging
        directories removed.
    """
    resumed: set[str] = set()
    removed: list[Path] = []
    for old in leftovers.dead(store, ".airgap-staging-*"):
        if old == staging:
            continue
        for sha in plan.targets:
            candidate = old / f"blob-{sha}"
            if sha in resumed or not _is_regular(candidate, plan.sizes[sha]):
                continue
            if digest(candidate) == sha:
                os.rename(candidate, staging / candidate.name)
                resumed.add(sha)
        shutil.rmtree(old, ignore_errors=True)
        removed.append(old)
    return resumed, removed


def _is_regular(path: Path, size: int) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size == size


def commit(plan: Plan, staged: dict[str, Path], staging: Path) -> None:
    """Rename everything into place (blobs, links, whole trees, refs last); undo all on any
    failure.

    Every blob and link is written and fsynced (with its directory) before the first tree is
    published, and every tree before the first ref.

    Args:
        plan: what goes where.
        staged: blob sha256 -> its verified file in ``staging``.
        staging: the staging directory (same file system as every target).

    Raises:
        StoreError: ``io_error``: a rename or write failed; everything done was undone.
    """
    undo: list[Callable[[], None]] = []
    trash = staging / "trash"
    trash.mkdir()
    counter = iter(range(1 << 62))

    def makedirs(d: Path) -> None:
        missing = []
        while not d.exists():
            missing.append(d)
            d = d.parent
        for m in reversed(missing):
            m.mkdir()
            undo.append(m.rmdir)

    def place(src: Path, final: Path) -> None:
        makedirs(final.parent)
        if os.path.lexists(final):  # a damaged blob being repaired, or a moving ref
            old = trash / str(next(counter))
            os.rename(final, old)
            undo.append(functools.partial(os.rename, old, final))
        os.rename(src, final)
        undo.append(functools.partial(os.unlink, final))

    try:
        for sha, finals in plan.targets.items():
            for i, final in enumerate(finals):
                src = staged[sha]
                if i < len(finals) - 1:  # more than one target: copy, keep the staged file
                    src = staging / f"copy-{next(counter)}"
                    shutil.copyfile(staged[sha], src)
                    _fsync_file(src)
                place(src, final)
        for link, target in plan.links:
            tmp = staging / f"link-{next(counter)}"
            os.symlink(target, tmp)
            place(tmp, link)
        _fsync_dirs({p.parent for finals in plan.targets.values() for p in finals}
                    | {p.parent for p, _ in plan.links}
                    | {d for t in plan.trees for d in _tree_dirs(t.staged)})  # fmt: skip
        for tree in plan.trees:
            makedirs(tree.final.parent)
            if tree.replace and os.path.lexists(tree.final):
                old = trash / str(next(counter))  # removed with the staging directory
                os.rename(tree.final, old)
                undo.append(functools.partial(os.rename, old, tree.final))
            os.rename(tree.staged, tree.final)  # the one step a loader can see
            undo.append(functools.partial(os.rename, tree.final, tree.staged))
        _fsync_dirs({t.final.parent for t in plan.trees})
        for ref, commit in plan.refs:
            tmp = staging / f"ref-{next(counter)}"
            tmp.write_text(commit, encoding="ascii")
            place(tmp, ref)
        _fsync_dirs({p.parent for p, _ in plan.refs})
    except BaseException as exc:
        for action in reversed(undo):
            try:
                action()
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise StoreError(Code.IO_ERROR, f"install failed and was rolled back: {exc}") from exc
        raise


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tree_dirs(root: Path) -> list[Path]:
    """``root`` and every directory below it (symlinks not followed)."""
    return [Path(d) for d, _, _ in os.walk(root)]


def _fsync_dirs(dirs: set[Path]) -> None:
    for d in dirs:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
