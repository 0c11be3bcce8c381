"""Validation of every name a bundle can make us write: file paths, part names, refs.

A bundle comes from removable media and is hostile until its signature and content are verified;
even a correctly signed index is checked, so that a compromised or buggy packer cannot make
``unpack`` write outside its target. Rules (stricter than POSIX, so that a bundle unpacks the
same on Linux, macOS and Windows file systems):

* relative, ``/``-separated, no empty, ``.`` or ``..`` component, at most 4096 bytes in UTF-8,
  each component at most 255 bytes;
* no backslash, NUL or other control character, no ``:`` (drive letters ``C:``, NTFS streams);
* within one tree, no two paths equal when case is ignored (case-insensitive file systems would
  merge them), and no path that is both a file and a directory prefix of another file.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from airgap.errors import Code, fail
from weights import unsafe_path_reason

MAX_PATH_BYTES = 4096
MAX_COMPONENT_BYTES = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_path(path: object, *, what: str = "path") -> str:
    """Return ``path`` if it is a safe relative file path, else raise.

    Args:
        path: the candidate (any JSON value).
        what: label used in the error message (e.g. ``"file path in index"``).

    Raises:
        VerificationFailed: code ``unsafe_path``.
    """
    if not isinstance(path, str) or not path:
        raise fail(Code.UNSAFE_PATH, f"{what} {path!r} is not a non-empty string", path=str(path))
    reason = _unsafe_reason(path)
    if reason:
        raise fail(Code.UNSAFE_PATH, f"{what} {path!r} is unsafe: {reason}", path=path)
    return path


def _unsafe_reason(path: str) -> str | None:
    # One rule for names on disk (lock, sign) and in indexes (pack, unpack): weights owns it.
    return unsafe_path_reason(path)


def fold(path: str) -> str:
    """Case- and normalisation-folded form used to detect colliding names."""
    return unicodedata.normalize("NFC", path).casefold()


def check_tree(paths: Iterable[str], *, where: str) -> None:
    """Check that a set of safe paths can coexist in one directory tree on any file system.

    Args:
        paths: paths already accepted by ``check_path``.
        where: label of the tree for the error message (e.g. a repo id).

    Raises:
        VerificationFailed: code ``path_collision`` for names equal when case is ignored or a
            file that is also a directory of another file.
    """
    seen: dict[str, str] = {}
    for path in paths:
        key = fold(path)
        if key in seen:
            raise fail(
                Code.PATH_COLLISION,
                f"{where}: {seen[key]!r} and {path!r} collide when case is ignored",
                path=path,
            )
        seen[key] = path
    for key, path in seen.items():
        parts = key.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in seen:
                raise fail(
                    Code.PATH_COLLISION,
                    f"{where}: {seen[prefix]!r} is a file and a directory of {path!r}",
                    path=path,
                )


def part_name(index: int, count: int) -> str:
    """Name of part ``index`` (0-based) of ``count``: ``payload.000-of-012``.

    The width is 3 digits, more when ``count`` needs it, so names sort in order.
    """
    width = max(3, len(str(count)))
    return f"payload.{index:0{width}d}-of-{count:0{width}d}"


def check_ref_name(name: object) -> str:
    """Return a branch/tag name if it can be a file under ``refs/`` (``refs/pr/1`` nests).

    Raises:
        VerificationFailed: code ``unsafe_path``.
    """
    return check_path(name, what="revision name")
