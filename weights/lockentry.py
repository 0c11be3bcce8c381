"""The entries of a ``weights.lock``: a pinned file, a pinned repository, a local origin.

The file format is described in :mod:`weights.lockfile`; these are its values, built by the
parser (:mod:`weights.lockparse`) or by ``pin`` / ``lock`` from what they read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from weights.lockvalues import check_text

__all__ = ["LockEntry", "LockedFile", "Origin"]


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
