"""One rule for the files of a model directory, shared by lock, verify, sign and pack.

Every command that reads a model tree takes its files from :func:`model_files` (or checks a
pinned path with :func:`check_model_file`), so a tree one command accepts, every command
accepts, and a tree one refuses, every one refuses with the same code and line:

* a name must be a safe relative path that installs the same everywhere
  (:func:`unsafe_path_reason`: no ``:``, backslash, control character, absolute path, empty,
  ``.``/``..`` component, nor more than 4096 bytes or a component over 255 bytes; UTF-8);
* a symlink may only lead inside the tree, or for a Hugging Face cache snapshot
  (``models--org--name/snapshots/<commit>``) inside its repository directory (where
  ``blobs/`` lives); a symlink to a directory is refused wherever it leads (no command follows
  it, so none may pretend it covered what lies behind it);
* a symlink loop, a dangling symlink or a file that is not regular has its own code.

Errors: :class:`UnsafeTreeError` with ``code`` ``unsafe_path``, ``symlink_outside``,
``symlink_directory``, ``symlink_loop``, ``dangling_symlink`` or ``not_regular_file``.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from weights.errors import WeightsError

MAX_PATH_BYTES = 4096
MAX_COMPONENT_BYTES = 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class UnsafeTreeError(WeightsError):
    """A model tree holds a name or a link no command may read (code per instance).

    Attributes:
        path: The offending path as found on disk.
    """

    code = "unsafe_tree"

    def __init__(self, code: str, message: str, *, path: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.code = code
        self.path = path


def unsafe_path_reason(path: str) -> str | None:
    """Why ``path`` is not a safe relative file path, or None if it is.

    The same rule judges a name found on disk (lock, sign) and a name read from a lockfile or
    a bundle index (pack, unpack).
    """
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if "\0" in path:
        return "contains NUL"
    if "\\" in path:
        return "contains a backslash"
    if _CONTROL.search(path):
        return "contains a control character"
    if ":" in path:
        return "contains ':' (drive letter or alternate stream)"
    if path.startswith("/"):
        return "is absolute"
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        return f"is longer than {MAX_PATH_BYTES} bytes"
    for comp in path.split("/"):
        if comp in ("", ".", ".."):
            return f"has a {comp or 'empty'!r} component"
        if len(comp.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            return f"has a component longer than {MAX_COMPONENT_BYTES} bytes"
    return None


def tree_bound(root: Path) -> Path:
    """Where symlinks under ``root`` may lead: the cache repository directory for a snapshot
    (``.../models--org--name/snapshots/<commit>``), else ``root`` itself (resolved)."""
    real = root.resolve()
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return real.parent.parent
    return real


def _shown(root: Path, rel: str) -> str:
    return str(root / rel).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def check_model_file(root: Path, rel: str, bound: Path | None = None) -> Path:
    """Check one file of a model tree by the rule of the module docstring.

    Args:
        root: The model directory.
        rel: The file's relative POSIX path.
        bound: Where symlinks may lead (default :func:`tree_bound` of ``root``).

    Returns:
        The file's resolved path (inside ``bound``).

    Raises:
        UnsafeTreeError: The name or the link breaks the rule (codes in the module docstring).
    """
    shown = _shown(root, rel)
    reason = unsafe_path_reason(rel)
    if reason is not None:
        raise UnsafeTreeError("unsafe_path", f"{shown}: file name {reason}", path=shown,
                              hint="rename the file, or leave it out")
    bound = tree_bound(root) if bound is None else bound
    p = root / rel
    try:
        real = p.resolve(strict=True)
    except RuntimeError as exc:  # Python 3.11: "Symlink loop from ..."
        raise UnsafeTreeError("symlink_loop", f"{shown}: symlink loop", path=shown) from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeTreeError("symlink_loop", f"{shown}: symlink loop", path=shown) from exc
        if p.is_symlink():
            raise UnsafeTreeError("dangling_symlink", f"{shown}: symlink to nothing "
                                  f"({os.readlink(p)})", path=shown) from exc
        raise UnsafeTreeError("not_regular_file", f"{shown}: cannot be read "
                              f"({exc.strerror or exc})", path=shown) from exc
    if real != bound and bound not in real.parents:
        raise UnsafeTreeError("symlink_outside", f"{shown}: symlink leads outside {root} "
                              f"(to {real})", path=shown, hint="copy the file into the directory")
    mode = real.stat().st_mode
    if stat.S_ISDIR(mode):
        raise UnsafeTreeError("symlink_directory", f"{shown}: symlink to a directory ({real}); "
                              "no command follows it", path=shown,
                              hint="copy the directory's files in, or remove the link")
    if not stat.S_ISREG(mode):
        raise UnsafeTreeError("not_regular_file", f"{shown}: not a regular file", path=shown)
    return real


def ignored(rel: str, patterns: Iterable[str]) -> bool:
    """True if ``rel`` matches an ``fnmatch`` glob of ``patterns`` or lies under one."""
    return any(fnmatch.fnmatchcase(rel, g) or rel.startswith(g.rstrip("/") + "/")
               for g in patterns)


def model_files(root: Path, *, skip_dirs: Iterable[str] = (),
                ignore: Iterable[str] = ()) -> list[tuple[str, Path]]:
    """Every file of a model tree as ``(relative POSIX path, path under root)``, sorted.

    Directory symlinks are not descended into: each is judged as an entry (and refused).

    Args:
        root: The model directory.
        skip_dirs: Directory names not descended into at any depth (``.git`` ...).
        ignore: ``fnmatch`` globs of relative paths left out and not judged (what the
            operator told the command to leave alone).

    Raises:
        UnsafeTreeError: Any entry breaks the rule (the first one found in sorted order).
    """
    skip = set(skip_dirs)
    patterns = list(ignore)
    bound = tree_bound(root)
    out: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        links = [d for d in dirnames if (base / d).is_symlink()]
        dirnames[:] = sorted(d for d in dirnames if d not in skip and d not in links)
        for name in sorted([*filenames, *links]):
            p = base / name
            rel = p.relative_to(root).as_posix()
            if patterns and ignored(rel, patterns):
                continue
            check_model_file(root, rel, bound)
            out.append((rel, p))
    return sorted(out)


__all__ = [
    "UnsafeTreeError",
    "check_model_file",
    "model_files",
    "tree_bound",
    "unsafe_path_reason",
]
