"""Safe access to the files of a bundle directory on untrusted media.

Nothing here follows a symlink: every bundle file is ``lstat``-ed, must be a regular file with
one link, and is opened with ``O_NOFOLLOW`` (and ``O_NONBLOCK``, so a FIFO planted in place of a
part cannot hang us); the opened descriptor is checked again with ``fstat`` so a file swapped
between the two calls is caught too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from airgap.bundle import INDEX_NAME, SIGNATURE_NAME, Index, Part
from airgap.errors import AirgapError, Code, Problem, fail
from clishell.text import shown

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def check_bundle_dir(bundle: Path) -> None:
    """Raise ``bundle_not_found`` (a usage error) unless ``bundle`` is a directory."""
    if not bundle.is_dir():
        what = "does not exist" if not bundle.exists() else "is not a directory"
        raise AirgapError(Code.BUNDLE_NOT_FOUND, f"{bundle} is not a bundle directory ({what})",
                          hint="give the directory that `airgap pack --out` wrote: it holds "
                               "index.json, index.sig and the payload.* parts")


def _file_problem(st: os.stat_result, name: str, *, part: bool) -> Problem | None:
    """The problem with a bundle entry's type, if any."""
    where = {"part": name} if part else {"path": name}
    if stat.S_ISLNK(st.st_mode):
        return Problem(Code.PART_SYMLINK, f"{name} is a symbolic link; refusing it (copy the "
                       "bundle as plain files: cp -rL, rsync -rL)", **where)
    if not stat.S_ISREG(st.st_mode):
        return Problem(Code.PART_NOT_REGULAR, f"{name} is not a regular file", **where)
    if st.st_nlink != 1:
        return Problem(
            Code.PART_HARDLINK, f"{name} is a hard link ({st.st_nlink} links); refusing it "
            "(copy the bundle as separate files: cp -r, rsync -r without -H/--link-dest)",
            **where,
        )  # fmt: skip
    return None


def read_small(bundle: Path, name: str, limit: int, missing: Code) -> bytes:
    """Read a small bundle file (index.json, index.sig) safely.

    Raises:
        VerificationFailed: ``missing`` code if absent; ``part_symlink``/``part_hardlink``/
            ``part_not_regular`` for a file of the wrong type; ``index_invalid`` if larger
            than ``limit`` bytes.
    """
    path = bundle / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise fail(missing, f"{path} is missing") from None
    problem = _file_problem(st, name, part=False)
    if problem:
        raise fail(Code(problem.code), problem.message, path=name)
    if st.st_size > limit:
        raise fail(Code.INDEX_INVALID, f"{name} is larger than {limit} bytes")
    fd = os.open(path, _OPEN_FLAGS)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise fail(Code.INDEX_INVALID, f"{name} is larger than {limit} bytes")
    return data


def check_parts(bundle: Path, index: Index) -> tuple[list[Problem], set[str]]:
    """Check presence, type and size of every part, and look for parts the index does not list.

    Returns:
        (problems, names of the parts that passed and can be read).
    """
    problems: list[Problem] = []
    good: set[str] = set()
    for part in index.parts:
        try:
            st = os.lstat(bundle / part.name)
        except FileNotFoundError:
            problems.append(Problem(Code.PART_MISSING, f"part {part.name} is missing",
                                    part=part.name))  # fmt: skip
            continue
        problem = _file_problem(st, part.name, part=True)
        if problem is None and st.st_size != part.size:
            kind = "truncated" if st.st_size < part.size else "extended"
            problem = Problem(
                Code.PART_SIZE_MISMATCH,
                f"part {part.name} is {kind}: {st.st_size} bytes, expected {part.size}",
                part=part.name, expected=str(part.size), actual=str(st.st_size),
            )  # fmt: skip
        if problem:
            problems.append(problem)
        else:
            good.add(part.name)
    listed = {p.name for p in index.parts} | {INDEX_NAME, SIGNATURE_NAME}
    for entry in sorted(os.listdir(bundle)):
        if entry not in listed and entry.startswith("payload"):
            problems.append(
                Problem(Code.PART_EXTRA, f"{shown(entry)} is not listed in the index: an extra "
                        "part (remove it; parts are never taken from file names)", part=entry)
            )  # fmt: skip
    return problems, good


def open_part(bundle: Path, part: Part) -> int:
    """Open a part for reading and re-check it on the descriptor; returns the fd.

    Raises:
        VerificationFailed: the part changed type or size since ``check_parts``.
    """
    try:
        fd = os.open(bundle / part.name, _OPEN_FLAGS)
    except OSError as exc:
        raise fail(Code.CONTENT_UNREADABLE, f"cannot open part {part.name}: {exc}",
                   part=part.name) from None  # fmt: skip
    st = os.fstat(fd)
    problem = _file_problem(st, part.name, part=True)
    if problem is None and st.st_size != part.size:
        problem = Problem(Code.PART_SIZE_MISMATCH, f"part {part.name} changed size while read",
                          part=part.name, expected=str(part.size), actual=str(st.st_size))
    if problem:
        os.close(fd)
        raise fail(Code(problem.code), problem.message, part=part.name)
    if hasattr(os, "posix_fadvise"):  # larger read-ahead on removable media
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    return fd
