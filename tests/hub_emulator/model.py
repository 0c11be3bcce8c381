"""In-memory git-like model of Hugging Face Hub repositories.

A :class:`Repo` has commits (each a full file set), branches and tags. File identities follow
the Hub: regular files are git blobs (``oid`` = git blob SHA-1 of the content); LFS files are
stored in git as an LFS pointer (``oid`` = git blob SHA-1 of the pointer text) and identified
by the sha256 of their content. Files named ``*.safetensors``, ``*.bin``, ``*.onnx`` or larger
than 10 MB are LFS, as on the Hub with its default ``.gitattributes``.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import yaml

LFS_SUFFIXES = (".safetensors", ".bin", ".onnx")
LFS_THRESHOLD_BYTES = 10 * 1000 * 1000


def git_blob_sha1(data: bytes) -> str:
    """Git blob SHA-1: sha1(b"blob <len>\\0" + data)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def is_lfs_path(path: str, size: int) -> bool:
    """True if the Hub would store this file in LFS (by suffix or size)."""
    return path.endswith(LFS_SUFFIXES) or size > LFS_THRESHOLD_BYTES


@dataclass(frozen=True, eq=False)
class Blob:
    """File content with its digests, computed once and shared between commits."""

    data: bytes

    @cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @cached_property
    def git_sha1(self) -> str:
        return git_blob_sha1(self.data)

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class FileEntry:
    """A file in one commit."""

    path: str
    blob: Blob
    lfs: bool

    @cached_property
    def pointer(self) -> bytes:
        """The git-lfs pointer text stored in git for an LFS file."""
        return (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.blob.sha256}\n"
            f"size {self.blob.size}\n"
        ).encode()

    @property
    def oid(self) -> str:
        """Git object id as the Hub reports it (``blobId`` / tree ``oid``)."""
        return git_blob_sha1(self.pointer) if self.lfs else self.blob.git_sha1

    @property
    def etag(self) -> str:
        """What the resolve endpoint reports as the file identity."""
        return self.blob.sha256 if self.lfs else self.blob.git_sha1


@dataclass(frozen=True)
class Commit:
    """One commit: a complete file set."""

    sha: str
    files: Mapping[str, FileEntry]
    parent: str | None
    message: str
    date: datetime

    def card_data(self) -> dict[str, Any] | None:
        """YAML front matter of README.md, as the Hub exposes it in ``cardData``."""
        readme = self.files.get("README.md")
        if readme is None:
            return None
        text = readme.blob.data.decode("utf-8", "replace")
        if not text.startswith("---"):
            return None
        end = text.find("\n---", 3)
        if end < 0:
            return None
        doc = yaml.safe_load(text[3:end])
        return doc if isinstance(doc, dict) else None


def _blob(value: bytes | Blob) -> Blob:
    return value if isinstance(value, Blob) else Blob(value)


@dataclass
class Repo:
    """A model repository: commits, branches, tags, gating."""

    repo_id: str
    gated: bool | str = False
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def commit(
        self,
        files: Mapping[str, bytes | Blob],
        *,
        branch: str = "main",
        message: str = "update",
        replace: bool = True,
    ) -> str:
        """Create a commit on ``branch`` and move the branch to it; return the commit SHA.

        Args:
            files: New content by path. With ``replace`` the commit holds exactly these files;
                otherwise they are applied over the branch head (a None-free update).
            branch: Branch to commit on (created if absent).
            message: Commit message (part of the SHA).
            replace: Whether ``files`` is the complete file set.
        """
        with self._lock:
            parent = self.branches.get(branch)
            tree: dict[str, FileEntry] = {}
            if not replace and parent is not None:
                tree.update(self.commits[parent].files)
            for path, value in files.items():
                blob = _blob(value)
                tree[path] = FileEntry(path, blob, is_lfs_path(path, blob.size))
            listing = "".join(f"{e.oid} {p}\n" for p, e in sorted(tree.items()))
            seed = f"tree\n{listing}parent {parent}\n{message}\n{len(self.commits)}"
            sha = hashlib.sha1(seed.encode(), usedforsecurity=False).hexdigest()
            self.commits[sha] = Commit(sha, tree, parent, message, datetime.now(UTC))
            self.branches[branch] = sha
            return sha

    def tag(self, name: str, revision: str) -> str:
        """Point tag ``name`` at ``revision``; return the commit SHA."""
        commit = self.resolve(revision)
        if commit is None:
            raise KeyError(revision)
        self.tags[name] = commit.sha
        return commit.sha

    def resolve(self, revision: str) -> Commit | None:
        """Resolve a branch, tag or full commit SHA to a commit (None if unknown)."""
        if revision in self.branches:
            return self.commits[self.branches[revision]]
        if revision in self.tags:
            return self.commits[self.tags[revision]]
        return self.commits.get(revision)


@dataclass
class Fault:
    """A one-shot (or n-shot) misbehaviour of the resolve endpoint for one file."""

    path: str
    kind: str  # "cut": drop the connection after `after_bytes`; "corrupt": flip byte `offset`;
    # "pad": send `extra_bytes` more than the file (Content-Length says so if `declare_length`,
    # else the body is chunked)
    after_bytes: int = 0
    offset: int = 0
    times: int = 1
    extra_bytes: int = 0
    declare_length: bool = True


@dataclass(frozen=True)
class RequestRecord:
    """One request seen by the emulator."""

    method: str
    path: str
    range: str | None
    authorized: bool


class Hub:
    """The hub state served by :func:`tests.hub_emulator.app.create_hub_app`."""

    def __init__(self, tokens: tuple[str, ...] = ("hf_emulator_token",)) -> None:
        self.repos: dict[str, Repo] = {}
        self.tokens = set(tokens)
        self.faults: list[Fault] = []
        self.requests: list[RequestRecord] = []
        self.rewrite_info: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        """When set, every model-info answer (``/api/models/...``) is passed through it before
        it is sent: a hostile or broken hub (another repo's id, another commit, odd siblings)."""
        self.redirect_to: str | None = None
        """When set (a base URL), a GET of an LFS file's ``/resolve/`` URL is answered ``302``
        to the same path under this base with ``?cdn=1`` appended, as the Hub redirects to
        its content hosts; a request carrying ``cdn`` is served, never redirected again."""
        self._lock = threading.Lock()

    def add_repo(self, repo_id: str, *, gated: bool | str = False) -> Repo:
        """Create an empty repository (``org/name``)."""
        repo = Repo(repo_id, gated=gated)
        self.repos[repo_id.lower()] = repo
        return repo

    def find(self, repo_id: str) -> Repo | None:
        """Look a repository up case-insensitively, as the Hub does."""
        return self.repos.get(repo_id.lower())

    def cut_connection(self, path: str, after_bytes: int, times: int = 1) -> None:
        """Drop the connection of the next ``times`` GETs of ``path`` after ``after_bytes``."""
        with self._lock:
            self.faults.append(Fault(path, "cut", after_bytes=after_bytes, times=times))

    def corrupt(self, path: str, offset: int, times: int = 1) -> None:
        """Flip the byte at ``offset`` in the next ``times`` GETs of ``path`` (size unchanged)."""
        with self._lock:
            self.faults.append(Fault(path, "corrupt", offset=offset, times=times))

    def pad(self, path: str, extra_bytes: int, *, declare_length: bool = True,
            times: int = 1) -> None:
        """Send ``extra_bytes`` more than the content in the next ``times`` GETs of ``path``
        (a hub or mirror that serves another, larger file under the pinned name)."""
        with self._lock:
            self.faults.append(Fault(path, "pad", extra_bytes=extra_bytes,
                                     declare_length=declare_length, times=times))

    def take_faults(self, path: str) -> list[Fault]:
        """Consume the faults armed for ``path`` (each use decrements ``times``)."""
        with self._lock:
            hit = [f for f in self.faults if f.path == path and f.times > 0]
            for f in hit:
                f.times -= 1
            self.faults = [f for f in self.faults if f.times > 0]
            return hit

    def record(self, rec: RequestRecord) -> None:
        with self._lock:
            self.requests.append(rec)

    def downloads(self, path_suffix: str) -> list[RequestRecord]:
        """GET requests of resolve URLs ending with ``path_suffix``."""
        return [
            r for r in self.requests
            if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(path_suffix)
        ]
