"""The ``weights.lock`` file: what was pinned, at which commit, with which digests.

Format (version 1), deterministic UTF-8 JSON text produced by
``json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\\n"``, entries sorted by
``repo_id`` and files sorted by ``path`` so that a re-pin diffs well in review::

    {"version": 1, "models": [{
        "repo_id": "sentence-transformers/all-MiniLM-L6-v2",   # as the Hub spells it
        "requested_revision": "main",                          # branch, tag or SHA asked for
        "commit": "<40 hex>",                                  # what it resolved to
        "license": "apache-2.0" | null,                        # model card licence
        "gated": false,
        "pinned_at": "2026-11-30T04:00:00Z",                   # UTC, second precision
        "origin": {"kind": "local", "path": "/srv/models/x",   # only for `weights lock DIR`
                   "claimed_repo_id": "org/name" | null, "claimed_commit": "<40 hex>" | null},
        "files": [{"path": "config.json", "size": 612, "sha256": "<64 hex>",
                   "git_sha1": "<40 hex>" | null, "lfs": false,
                   "scan": "<scanner> <version>: safe (...)"}, ...]}]}   # pickles only

``sha256`` is always the digest of the file content; ``git_sha1`` is the git blob SHA-1 the Hub
reports for regular files (null for LFS files, whose git object is only a pointer).

This module holds the whole file (:class:`Lockfile`: invariants, atomic save, load); the
entries are in :mod:`weights.lockentry`, the reading of the JSON in :mod:`weights.lockparse`
and the rules for single values in :mod:`weights.lockvalues`.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clishell import read_input_text
from weights.errors import EmptyModelError, EntryNotInLockError, LockfileError, PathCollisionError
from weights.installpaths import first_collision
from weights.lockentry import LockedFile, LockEntry, Origin
from weights.lockparse import parse_entries
from weights.lockvalues import check_repo_path, is_commit_sha, is_repo_id, repo_id_problem

LOCKFILE_VERSION = 1


def umask_mode(fd: int) -> None:
    """Give a ``mkstemp`` file (always 0600) the mode a plain ``open`` would: 0666 & ~umask.

    Lockfiles are shared and cache refs are read by vLLM running as another user."""
    mask = os.umask(0o077)  # read it; restrictive meanwhile, should another thread create
    os.umask(mask)
    os.fchmod(fd, 0o666 & ~mask)


@dataclass(frozen=True)
class Lockfile:
    """A whole ``weights.lock``: entries sorted by repo id, at most one per repo id.

    Invariants (checked whenever one is built: loaded, pinned, carried in a bundle): every
    model pins at least one file, and no two pinned files install to one path in any layout
    (:mod:`weights.installpaths`).

    Raises:
        LockfileError: Two entries for one repo id.
        EmptyModelError: A model pins no file.
        PathCollisionError: Two files (or repo ids) collide; the message names both.
    """

    entries: tuple[LockEntry, ...] = ()

    def __post_init__(self) -> None:
        entries = tuple(sorted(self.entries, key=lambda e: e.repo_id))
        seen: set[str] = set()
        for e in entries:
            if e.repo_id in seen:
                raise LockfileError(f"duplicate entry for {e.repo_id!r}")
            seen.add(e.repo_id)
            if not e.files:
                raise EmptyModelError(f"model {e.repo_id} pins no files",
                                      hint="re-pin it with --include patterns that match")
        clash = first_collision([(e.repo_id, (f.path for f in e.files)) for e in entries])
        if clash is not None:
            first, second, why = clash
            raise PathCollisionError(f"{first} and {second} {why}", first=first, second=second)
        object.__setattr__(self, "entries", entries)

    def entry(self, repo_id: str) -> LockEntry:
        """Return the entry for ``repo_id`` (exact match, or case-insensitive if unique).

        Raises:
            EntryNotInLockError: The repository is not pinned in this lockfile.
        """
        for e in self.entries:
            if e.repo_id == repo_id:
                return e
        folded = [e for e in self.entries if e.repo_id.lower() == repo_id.lower()]
        if len(folded) == 1:
            return folded[0]
        raise EntryNotInLockError(
            f"{repo_id} is not pinned in the lockfile",
            hint=f"run `weights pin {repo_id}` first",
        )

    def get(self, repo_id: str) -> LockEntry | None:
        """Return the entry for ``repo_id`` or None (same matching as :meth:`entry`)."""
        try:
            return self.entry(repo_id)
        except EntryNotInLockError:
            return None

    def with_entry(self, entry: LockEntry) -> Lockfile:
        """Return a new lockfile with ``entry`` added or replacing the one for its repo id."""
        rest = [e for e in self.entries if e.repo_id.lower() != entry.repo_id.lower()]
        return replace(self, entries=(*rest, entry))

    def without(self, repo_id: str) -> Lockfile:
        """Return a new lockfile without the entry for ``repo_id`` (no-op if absent)."""
        return replace(self, entries=tuple(e for e in self.entries if e.repo_id != repo_id))

    def to_json(self) -> dict[str, Any]:
        """Return the lockfile as a JSON-ready dict."""
        return {"version": LOCKFILE_VERSION, "models": [e.to_json() for e in self.entries]}

    def dumps(self) -> str:
        """Return the canonical text of the lockfile (deterministic, ends with a newline)."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the lockfile atomically: temp file in the same directory, fsync, rename.

        Raises:
            LockfileError: The file cannot be written.
        """
        target = Path(path)
        data = self.dumps().encode("utf-8")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            try:
                umask_mode(fd)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            _fsync_dir(target.parent)
        except OSError as exc:
            raise LockfileError(f"cannot write {target}: {exc.strerror or exc}") from exc

    @classmethod
    def loads(cls, text: str, *, source: str = "<string>") -> Lockfile:
        """Parse lockfile text.

        Args:
            text: The JSON text.
            source: Name used in error messages (usually the file path).

        Raises:
            LockfileError: Not JSON, wrong version, or an invalid field; the message names
                ``source`` and the JSON path of the field (e.g. ``$.models[0].files[2].sha256``).
        """
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LockfileError(
                f"{source}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
            ) from exc
        return _parse(doc, source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Lockfile:
        """Read and validate a lockfile.

        Raises:
            LockfileError: Unreadable file or invalid content (see :meth:`loads`).
        """
        p = Path(path)
        try:
            text = read_input_text(p)
        except FileNotFoundError as exc:
            raise LockfileError(
                f"{p}: lockfile not found",
                hint=f"pin a model with `weights pin REPO_ID --lock {p}` (online), or lock "
                     f"local files with `weights lock DIR --repo-id ORG/NAME --lock {p}` "
                     "(offline)") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise LockfileError(f"{p}: cannot read lockfile: {exc}") from exc
        return cls.loads(text, source=str(p))

    @classmethod
    def load_or_empty(cls, path: str | os.PathLike[str]) -> Lockfile:
        """Like :meth:`load`, but an absent file is an empty lockfile."""
        if not Path(path).exists():
            return cls()
        return cls.load(path)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _parse(doc: Any, source: str) -> Lockfile:
    entries = parse_entries(doc, source, LOCKFILE_VERSION)
    try:
        return Lockfile(entries=tuple(entries))
    except LockfileError as exc:  # an invariant of the whole file: say which file
        exc.message = f"{source}: {exc.message}"
        exc.args = (exc.message,)
        raise


def validate_entry(entry: LockEntry) -> LockEntry:
    """Check an entry built in code against the same rules :meth:`Lockfile.load` applies.

    Raises:
        LockfileError: A field is invalid (message names it).
    """
    _parse({"version": LOCKFILE_VERSION, "models": [entry.to_json()]}, f"entry {entry.repo_id}")
    return entry


__all__ = [
    "LOCKFILE_VERSION",
    "LockEntry",
    "LockedFile",
    "Lockfile",
    "Origin",
    "check_repo_path",
    "is_commit_sha",
    "is_repo_id",
    "repo_id_problem",
    "validate_entry",
]
