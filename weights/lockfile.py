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
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from clishell import UNSAFE_TEXT
from weights.errors import EmptyModelError, EntryNotInLockError, LockfileError, PathCollisionError
from weights.installpaths import first_collision

LOCKFILE_VERSION = 1

_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
# Hub repo ids (huggingface_hub ``utils/_validators.py``, ``validate_repo_id`` and
# ``REPO_ID_REGEX``): ``name`` or ``namespace/name``, each 1-96 ASCII characters of
# ``[A-Za-z0-9_.-]`` starting and ending with a letter, digit or ``_`` (``\b`` in the Hub's
# regex), no ``--`` or ``..`` anywhere, not ending in ``.git``.
_REPO_PART = r"(?:[A-Za-z0-9_]|[A-Za-z0-9_][A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])"
_REPO_ID = re.compile(rf"(?:{_REPO_PART}/)?{_REPO_PART}", re.ASCII)
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")
# Characters that rewrite what a terminal shows (clishell.UNSAFE_TEXT: C0/C1 controls, the
# Unicode bidirectional marks and overrides). Lock values are printed by pin, verify, the
# air-gap inspect/verify/unpack; a licence string from a model card is the model publisher's
# text, so none of these may pass into a lockfile.
_UNSAFE_TEXT = UNSAFE_TEXT
_UNSAFE_WHY = ("control or bidirectional-override characters are refused (they would rewrite "
               "the output of every command that prints this value)")


def check_text(value: str, where: str) -> None:
    """Refuse a lockfile text value that could rewrite terminal output.

    Args:
        value: A free-text value (licence, origin path, scan verdict, revision).
        where: What it is, for the message (the value is shown escaped).

    Raises:
        LockfileError: ``value`` holds a control or bidirectional-override character.
    """
    if _UNSAFE_TEXT.search(value) is not None:
        raise LockfileError(f"{where}: {value!r}: {_UNSAFE_WHY}")


def is_commit_sha(value: str) -> bool:
    """Return True if ``value`` is a full 40-hex lower-case git commit SHA."""
    return _HEX40.fullmatch(value) is not None


def umask_mode(fd: int) -> None:
    """Give a ``mkstemp`` file (always 0600) the mode a plain ``open`` would: 0666 & ~umask.

    Lockfiles are shared and cache refs are read by vLLM running as another user."""
    mask = os.umask(0o077)  # read it; restrictive meanwhile, should another thread create
    os.umask(mask)
    os.fchmod(fd, 0o666 & ~mask)


def repo_id_problem(value: str) -> str | None:
    """Why ``value`` is not a Hub repository id, or None if it is one.

    Rules of the Hub (huggingface_hub ``validate_repo_id``): ``name`` or ``namespace/name``;
    each part 1 to 96 characters of ``A-Z a-z 0-9 _ . -``, not starting or ending with ``-``
    or ``.``; ``--`` and ``..`` are forbidden (``--`` separates the parts of a cache folder
    name ``models--org--name``, so it would make two ids share one folder); no ``.git`` end.
    """
    if _REPO_ID.fullmatch(value) is None:
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


@dataclass(frozen=True)
class LockedFile:
    """One pinned file.

    Attributes:
        path: Repository-relative POSIX path (validated: cannot escape a directory).
        size: Size in bytes.
        sha256: Lower-case hex SHA-256 of the content.
        git_sha1: Git blob SHA-1 of the content for regular files; None for LFS files.
        lfs: True if the Hub stores the file in LFS.
        scan: For a pickle-based file accepted with ``--allow-pickle``, the scanner's verdict
            line (``"<scanner> <version>: safe (globals: ...)"``; :mod:`weights.serialisation`);
            None otherwise (the key is then absent from the JSON).
    """

    path: str
    size: int
    sha256: str
    git_sha1: str | None
    lfs: bool
    scan: str | None = None

    @property
    def blob_id(self) -> str:
        """Name of the file's blob in the Hugging Face cache (``blobs/<blob_id>``).

        sha256 for LFS files, git blob SHA-1 for regular files (the ETag the Hub serves).
        """
        if self.lfs or self.git_sha1 is None:
            return self.sha256
        return self.git_sha1

    def to_json(self) -> dict[str, Any]:
        """Return the file as a JSON-ready dict (lockfile schema)."""
        doc: dict[str, Any] = {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "git_sha1": self.git_sha1,
            "lfs": self.lfs,
        }
        if self.scan is not None:
            doc["scan"] = self.scan
        return doc


@dataclass(frozen=True)
class Origin:
    """Where a locked model came from when it did not come from a hub (``weights lock DIR``).

    Attributes:
        kind: ``"local"``: a directory or a Hugging Face cache snapshot already on disk.
        path: Absolute path of the directory when it was locked.
        claimed_repo_id: Upstream repository the operator (or the cache layout) declared;
            a claim, not verified against any hub.
        claimed_commit: Upstream commit declared with it; a claim, not verified.
    """

    kind: str
    path: str
    claimed_repo_id: str | None = None
    claimed_commit: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the origin as a JSON-ready dict (lockfile schema)."""
        return {"kind": self.kind, "path": self.path, "claimed_repo_id": self.claimed_repo_id,
                "claimed_commit": self.claimed_commit}


@dataclass(frozen=True)
class LockEntry:
    """One pinned repository at one commit.

    Attributes:
        repo_id: Canonical repository id as the Hub spells it (``org/name``).
        requested_revision: Branch, tag or SHA the operator asked for.
        commit: 40-hex commit SHA it resolved to.
        files: Pinned files, sorted by path.
        license: Model card licence identifier, or None if the card declares none.
        gated: Whether the repository is gated on the Hub.
        pinned_at: UTC timestamp ``YYYY-MM-DDTHH:MM:SSZ`` of the pin.
        origin: None for a hub pin; :class:`Origin` for a model locked from disk (the key
            is then written as ``"origin"``; absent otherwise).
    """

    repo_id: str
    requested_revision: str
    commit: str
    files: tuple[LockedFile, ...]
    license: str | None = None
    gated: bool = False
    pinned_at: str = "1970-01-01T00:00:00Z"
    origin: Origin | None = None
    _by_path: dict[str, LockedFile] = field(
        init=False, repr=False, compare=False, hash=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        if self.license is not None:  # also for entries built from Hub data (pin)
            check_text(self.license, f"{self.repo_id}: licence")
        files = tuple(sorted(self.files, key=lambda f: f.path))
        object.__setattr__(self, "files", files)
        object.__setattr__(self, "_by_path", {f.path: f for f in files})

    def file(self, path: str) -> LockedFile:
        """Return the pinned file at ``path``.

        Raises:
            KeyError: No such file in this entry.
        """
        return self._by_path[path]

    def get(self, path: str) -> LockedFile | None:
        """Return the pinned file at ``path`` or None."""
        return self._by_path.get(path)

    @property
    def total_bytes(self) -> int:
        """Sum of the pinned file sizes, in bytes."""
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        """Return the entry as a JSON-ready dict (lockfile schema)."""
        doc: dict[str, Any] = {
            "repo_id": self.repo_id,
            "requested_revision": self.requested_revision,
            "commit": self.commit,
            "license": self.license,
            "gated": self.gated,
            "pinned_at": self.pinned_at,
            "files": [f.to_json() for f in self.files],
        }
        if self.origin is not None:
            doc["origin"] = self.origin.to_json()
        return doc


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
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise LockfileError(
                f"{p}: lockfile not found", hint="pin a model first with `weights pin REPO_ID`"
            ) from exc
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


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, what: str) -> LockfileError:
        return LockfileError(f"{self.source}: {where}: {what}")

    def obj(self, value: Any, where: str, keys: Iterable[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, "expected an object")
        missing = [k for k in keys if k not in value]
        if missing:
            raise self.fail(f"{where}.{missing[0]}", "missing field")
        return value

    def string(self, value: Any, where: str, pattern: re.Pattern[str] | None = None) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"expected a string, got {type(value).__name__}")
        if _UNSAFE_TEXT.search(value) is not None:
            raise self.fail(where, f"{value!r}: {_UNSAFE_WHY}")
        if pattern is not None and pattern.fullmatch(value) is None:
            raise self.fail(where, f"malformed value {value!r}")
        return value

    def opt_string(
        self, value: Any, where: str, pattern: re.Pattern[str] | None = None
    ) -> str | None:
        return None if value is None else self.string(value, where, pattern)

    def boolean(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(where, f"expected true or false, got {value!r}")
        return value


def _parse(doc: Any, source: str) -> Lockfile:
    p = _Parser(source)
    root = p.obj(doc, "$", ("version", "models"))
    if root["version"] != LOCKFILE_VERSION:
        raise p.fail("$.version", f"unsupported lockfile version {root['version']!r}")
    models = root["models"]
    if not isinstance(models, list):
        raise p.fail("$.models", "expected an array")
    entries: list[LockEntry] = []
    seen: set[str] = set()
    for i, raw in enumerate(models):
        where = f"$.models[{i}]"
        m = p.obj(raw, where, ("repo_id", "requested_revision", "commit", "files"))
        repo_id = p.string(m["repo_id"], f"{where}.repo_id")
        if (why := repo_id_problem(repo_id)) is not None:
            raise p.fail(f"{where}.repo_id", f"{repo_id!r}: {why}")
        if repo_id in seen:
            raise p.fail(f"{where}.repo_id", f"duplicate entry for {repo_id!r}")
        seen.add(repo_id)
        files_raw = m["files"]
        if not isinstance(files_raw, list):
            raise p.fail(f"{where}.files", "expected an array")
        files: list[LockedFile] = []
        paths: set[str] = set()
        for j, fraw in enumerate(files_raw):
            fw = f"{where}.files[{j}]"
            f = p.obj(fraw, fw, ("path", "size", "sha256", "lfs"))
            path = p.string(f["path"], f"{fw}.path")
            try:
                check_repo_path(path)
            except ValueError as exc:
                raise p.fail(f"{fw}.path", str(exc)) from None
            if path in paths:
                raise p.fail(f"{fw}.path", f"duplicate file {path!r}")
            paths.add(path)
            size = f["size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise p.fail(f"{fw}.size", f"expected a non-negative integer, got {size!r}")
            files.append(
                LockedFile(
                    path=path,
                    size=size,
                    sha256=p.string(f["sha256"], f"{fw}.sha256", _HEX64),
                    git_sha1=p.opt_string(f.get("git_sha1"), f"{fw}.git_sha1", _HEX40),
                    lfs=p.boolean(f["lfs"], f"{fw}.lfs"),
                    scan=p.opt_string(f.get("scan"), f"{fw}.scan"),
                )
            )
        revision = p.string(m["requested_revision"], f"{where}.requested_revision")
        try:  # it becomes refs/<revision> in a cache: it must not leave refs/
            check_repo_path(revision)
        except ValueError:
            raise p.fail(f"{where}.requested_revision",
                         f"unsafe revision {revision!r}") from None
        entries.append(
            LockEntry(
                repo_id=repo_id,
                requested_revision=revision,
                commit=p.string(m["commit"], f"{where}.commit", _HEX40),
                files=tuple(files),
                license=p.opt_string(m.get("license"), f"{where}.license"),
                gated=p.boolean(m.get("gated", False), f"{where}.gated"),
                pinned_at=p.string(
                    m.get("pinned_at", "1970-01-01T00:00:00Z"), f"{where}.pinned_at", _TIMESTAMP
                ),
                origin=_origin(p, m.get("origin"), f"{where}.origin"),
            )
        )
    try:
        return Lockfile(entries=tuple(entries))
    except LockfileError as exc:  # an invariant of the whole file: say which file
        exc.message = f"{source}: {exc.message}"
        exc.args = (exc.message,)
        raise


def _origin(p: _Parser, raw: Any, where: str) -> Origin | None:
    if raw is None:
        return None
    o = p.obj(raw, where, ("kind", "path"))
    if o["kind"] != "local":
        raise p.fail(f"{where}.kind", f"unknown origin kind {o['kind']!r} (expected 'local')")
    return Origin(
        kind="local",
        path=p.string(o["path"], f"{where}.path"),
        claimed_repo_id=p.opt_string(o.get("claimed_repo_id"), f"{where}.claimed_repo_id",
                                     _REPO_ID),
        claimed_commit=p.opt_string(o.get("claimed_commit"), f"{where}.claimed_commit", _HEX40),
    )


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
