"""Rules for the values of a ``weights.lock``: repo ids, file paths, commits, digests, text.

Shared by the lockfile parser (:mod:`weights.lockparse`), the entries themselves
(:mod:`weights.lockentry`) and the commands that take such values from the command line.
"""

from __future__ import annotations

import re

from clishell import UNSAFE_TEXT
from weights.errors import LockfileError

__all__ = [
    "HEX40",
    "HEX64",
    "REPO_ID",
    "TIMESTAMP",
    "UNSAFE_TEXT_WHY",
    "check_repo_path",
    "check_text",
    "is_commit_sha",
    "is_repo_id",
    "repo_id_problem",
]

HEX40 = re.compile(r"[0-9a-f]{40}")
HEX64 = re.compile(r"[0-9a-f]{64}")
# Hub repo ids (huggingface_hub ``utils/_validators.py``, ``validate_repo_id`` and
# ``REPO_ID_REGEX``): ``name`` or ``namespace/name``, each 1-96 ASCII characters of
# ``[A-Za-z0-9_.-]`` starting and ending with a letter, digit or ``_`` (``\b`` in the Hub's
# regex), no ``--`` or ``..`` anywhere, not ending in ``.git``.
_REPO_PART = r"(?:[A-Za-z0-9_]|[A-Za-z0-9_][A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])"
REPO_ID = re.compile(rf"(?:{_REPO_PART}/)?{_REPO_PART}", re.ASCII)
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
# Characters that rewrite what a terminal shows (clishell.UNSAFE_TEXT: C0/C1 controls, the
# Unicode bidirectional marks and overrides). Lock values are printed by pin, verify, the
# air-gap inspect/verify/unpack; a licence string from a model card is the model publisher's
# text, so none of these may pass into a lockfile.
UNSAFE_TEXT_WHY = ("control or bidirectional-override characters are refused (they would rewrite "
               "the output of every command that prints this value)")


def check_text(value: str, where: str) -> None:
    """Refuse a lockfile text value that could rewrite terminal output.

    Args:
        value: A free-text value (licence, origin path, scan verdict, revision).
        where: What it is, for the message (the value is shown escaped).

    Raises:
        LockfileError: ``value`` holds a control or bidirectional-override character.
    """
    if UNSAFE_TEXT.search(value) is not None:
        raise LockfileError(f"{where}: {value!r}: {UNSAFE_TEXT_WHY}")


def is_commit_sha(value: str) -> bool:
    """Return True if ``value`` is a full 40-hex lower-case git commit SHA."""
    return HEX40.fullmatch(value) is not None


def repo_id_problem(value: str) -> str | None:
    """Why ``value`` is not a Hub repository id, or None if it is one.

    Rules of the Hub (huggingface_hub ``validate_repo_id``): ``name`` or ``namespace/name``;
    each part 1 to 96 characters of ``A-Z a-z 0-9 _ . -``, not starting or ending with ``-``
    or ``.``; ``--`` and ``..`` are forbidden (``--`` separates the parts of a cache folder
    name ``models--org--name``, so it would make two ids share one folder); no ``.git`` end.
    """
    if REPO_ID.fullmatch(value) is None:
        return ("a repo id is NAME or NAMESPACE/NAME, each 1-96 characters of A-Z a-z 0-9 _ . "
                "- not starting or ending with - or .")
    if "--" in value or ".." in value:
        return "'--' and '..' are forbidden in a repo id"
    if value.endswith(".git"):
        return "a repo id cannot end in '.git'"
    return None


def is_repo_id(value: str) -> bool:
    """Return True if ``value`` is a Hub repository id (see :func:`repo_id_problem`)."""
    return repo_id_problem(value) is None


def check_repo_path(path: str) -> str:
    """Validate a repository-relative file path and return it unchanged.

    A valid path is relative POSIX, non-empty, without ``.``/``..`` components, backslashes,
    NUL bytes or a leading ``/``: it can be joined under a directory without escaping it.

    Raises:
        ValueError: The path is unsafe or malformed.
    """
    if not path or "\\" in path or "\0" in path or path.startswith("/"):
        raise ValueError(f"unsafe file path {path!r}")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"unsafe file path {path!r}")
    return path
