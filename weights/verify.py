"""Offline verification of a model directory against a lock entry.

Reports, never raises, for content problems: files whose size or digest differ, pinned files
that are missing, files present but not pinned (vLLM globs ``*.safetensors`` when there is no
index, so an extra shard changes the model), and shards named in a
``*.safetensors.index.json`` ``weight_map`` that are absent (vLLM may load such a checkpoint
silently with missing tensors).

For a Hugging Face cache (a cache root, a ``models--org--name`` directory or one of its
snapshot directories) the files of the pinned commit's snapshot are checked, and also what a
loader resolving the repo id by its refs would read (huggingface_hub and vLLM with
``HF_HUB_OFFLINE=1`` read ``refs/<revision>`` and load ``snapshots/<its text>``): every ref
must name the pinned commit and the requested revision's ref must exist, or the report fails
naming the ref. Other snapshot directories (an earlier commit left by an update) are listed but
do not fail: no ref leads there, only a load by that commit's SHA.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from weights.cache import cache_repo_dir, read_refs, resolve_model_dir
from weights.digests import ProgressCallback, digest_file, sha256_file
from weights.errors import WeightsError
from weights.lockfile import LockedFile, LockEntry, is_commit_sha
from weights.modeltree import model_files


class Mismatch(NamedTuple):
    """A file whose content differs from the lock.

    ``expected`` and ``actual`` are prefixed by their kind: ``sha256:<hex>``,
    ``git-sha1:<hex>`` or ``size:<bytes>``.
    """

    path: str
    expected: str
    actual: str


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of :func:`verify_tree`.

    Attributes:
        root: Directory that was verified (the snapshot dir for a cache).
        repo_id: Repository of the lock entry.
        commit: Pinned commit.
        checked: Number of pinned files whose content was checked.
        bytes_checked: Bytes hashed.
        mismatched: Files whose size or digest differ.
        missing: Pinned files absent from the directory.
        extra: Files present but not pinned (relative POSIX paths).
        missing_shards: Shards named by an index file but absent.
        refs: Cache refs a loader would resolve to something else than the pinned commit:
            ``(ref path, expected, actual)`` with ``path`` ``refs/<name>``, ``expected``
            ``commit:<pinned sha>``, ``actual`` ``commit:<text of the ref>`` or ``absent``
            (the requested revision's ref is missing).
        extra_snapshots: Snapshot directories of the cache other than the pinned commit's
            (``snapshots/<name>``), listed for the operator; they do not make the report fail
            (no ref leads there once :attr:`refs` is empty: only a load by that SHA reads one).
        digests: sha256 of every file hashed, by path (lets a signature check reuse them).
    """

    root: Path
    repo_id: str
    commit: str
    checked: int
    bytes_checked: int
    mismatched: tuple[Mismatch, ...]
    missing: tuple[str, ...]
    extra: tuple[str, ...]
    missing_shards: tuple[str, ...]
    refs: tuple[Mismatch, ...] = ()
    extra_snapshots: tuple[str, ...] = ()
    digests: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when nothing is mismatched, missing, extra, a missing shard or a cache ref
        that resolves elsewhere (other snapshots are listed, not failed)."""
        return not (self.mismatched or self.missing or self.extra or self.missing_shards
                    or self.refs)

    def to_json(self) -> dict[str, Any]:
        """Return the report as a JSON-ready dict."""
        return {
            "ok": self.ok,
            "root": str(self.root),
            "repo_id": self.repo_id,
            "commit": self.commit,
            "checked": self.checked,
            "bytes_checked": self.bytes_checked,
            "mismatched": [m._asdict() for m in self.mismatched],
            "missing": list(self.missing),
            "extra": list(self.extra),
            "missing_shards": list(self.missing_shards),
            "refs": [m._asdict() for m in self.refs],
            "extra_snapshots": list(self.extra_snapshots),
        }


def check_file(
    path: Path,
    locked: LockedFile,
    progress: ProgressCallback | None = None,
    digests: dict[str, str] | None = None,
) -> Mismatch | None:
    """Compare one local file with its lock record (size first, then sha256 and git SHA-1).

    If ``digests`` is given, the computed sha256 is stored in it under the file's path.

    Returns:
        None if the file matches, else the first difference found.

    Raises:
        WeightsError: The file cannot be read.
    """
    size = path.stat().st_size
    if size != locked.size:
        return Mismatch(locked.path, f"size:{locked.size}", f"size:{size}")
    # LFS files have no git SHA-1 in the lock: hash once with sha256 only (about 2x faster).
    if locked.git_sha1 is None:
        sha256, git_sha1 = sha256_file(path, progress), None
    else:
        d = digest_file(path, progress)
        sha256, git_sha1 = d.sha256, d.git_sha1
    if digests is not None:
        digests[locked.path] = sha256
    if sha256 != locked.sha256:
        return Mismatch(locked.path, f"sha256:{locked.sha256}", f"sha256:{sha256}")
    if locked.git_sha1 is not None and git_sha1 != locked.git_sha1:
        return Mismatch(locked.path, f"git-sha1:{locked.git_sha1}", f"git-sha1:{git_sha1}")
    return None


def list_files(root: Path, *, skip_dirs: Iterable[str] = (),
               ignore: Iterable[str] = ()) -> list[str]:
    """Return every file under ``root`` as sorted relative POSIX paths, by the one tree rule
    (:func:`weights.modeltree.model_files`: a symlink leading outside, to a directory, in a
    loop, or an unsafe name is refused, never skipped or followed).

    Raises:
        UnsafeTreeError: The tree breaks the rule.
    """
    return [rel for rel, _p in model_files(root, skip_dirs=skip_dirs, ignore=ignore)]


def index_missing_shards(
    root: Path, index_paths: Iterable[str]
) -> tuple[list[str], list[Mismatch]]:
    """Return shards named in index files but absent under ``root``, and unreadable indexes.

    Args:
        root: Model directory.
        index_paths: Relative paths of ``*.index.json`` files (``weight_map`` format of
            safetensors and PyTorch sharded checkpoints).

    Returns:
        ``(missing_shards, problems)``: missing shard paths (relative to ``root``) and
        indexes that are not valid JSON with a ``weight_map`` object.
    """
    missing: set[str] = set()
    problems: list[Mismatch] = []
    for rel in index_paths:
        idx = root / rel
        if not idx.is_file():
            continue
        try:
            doc = json.loads(idx.read_text(encoding="utf-8"))
            weight_map = doc["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
            shards = {str(v) for v in weight_map.values()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            problems.append(Mismatch(rel, "index with weight_map", f"unreadable: {exc}"))
            continue
        parent = Path(rel).parent
        for shard in shards:
            shard_rel = (parent / shard).as_posix()
            target = root / shard_rel
            if ".." in Path(shard).parts or not target.is_file():
                missing.add(shard_rel)
    return sorted(missing), problems


def verify_tree(
    path: str | os.PathLike[str],
    entry: LockEntry,
    *,
    ignore: Iterable[str] = (),
    progress: ProgressCallback | None = None,
) -> VerifyReport:
    """Verify a directory against a lock entry, offline.

    Args:
        path: A plain directory, an HF cache snapshot dir, a cache repo dir
            (``models--org--name``) or a cache root.
        entry: The pinned entry to verify against.
        ignore: ``fnmatch`` patterns of relative paths not to report as extra.
        progress: Byte-count callback while hashing.

    Returns:
        A :class:`VerifyReport`; ``report.ok`` tells whether the directory matches.

    Raises:
        CacheLayoutError: ``path`` is not a directory or a cache lacks the pinned snapshot.
        UnsafeTreeError: The tree holds an unsafe name or link (:mod:`weights.modeltree`).
        WeightsError: A file cannot be read.
    """
    root = resolve_model_dir(path, entry)
    repo_dir = cache_repo_dir(path, entry)
    refs, extra_snapshots = ((), ()) if repo_dir is None else cache_problems(repo_dir, entry)
    patterns = list(ignore)
    present = list_files(root, ignore=patterns)  # the tree rule first: no hash through a bad link
    mismatched: list[Mismatch] = []
    missing: list[str] = []
    checked = 0
    hashed = 0
    hashed_digests: dict[str, str] = {}
    for locked in entry.files:
        target = root / locked.path
        if not target.is_file():
            missing.append(locked.path)
            continue
        try:
            mm = check_file(target, locked, progress, hashed_digests)
        except OSError as exc:
            raise WeightsError(f"cannot read {target}: {exc.strerror or exc}") from exc
        checked += 1
        hashed += locked.size
        if mm is not None:
            mismatched.append(mm)
    pinned = {f.path for f in entry.files}
    extra = [
        p
        for p in present
        if p not in pinned and not any(fnmatch.fnmatchcase(p, pat) for pat in patterns)
    ]
    indexes = sorted({p for p in (*pinned, *present) if p.endswith(".index.json")})
    shards, problems = index_missing_shards(root, indexes)
    return VerifyReport(
        root=root,
        repo_id=entry.repo_id,
        commit=entry.commit,
        checked=checked,
        bytes_checked=hashed,
        mismatched=tuple(mismatched + problems),
        missing=tuple(missing),
        extra=tuple(extra),
        missing_shards=tuple(shards),
        refs=refs,
        extra_snapshots=extra_snapshots,
        digests=hashed_digests,
    )


def cache_problems(repo_dir: Path, entry: LockEntry) -> tuple[tuple[Mismatch, ...],
                                                             tuple[str, ...]]:
    """What a loader resolving ``entry.repo_id`` in the cache repo ``repo_dir`` would read
    besides the pinned commit.

    Args:
        repo_dir: The ``models--org--name`` directory.
        entry: The pinned entry.

    Returns:
        ``(refs, extra_snapshots)``: refs whose text is not exactly the pinned commit (and the
        requested revision's ref when it is absent), as :class:`Mismatch` with path
        ``refs/<name>``; snapshot directories other than ``snapshots/<commit>``.

    Raises:
        CacheLayoutError: A ref cannot be read.
    """
    want = f"commit:{entry.commit}"
    refs = read_refs(repo_dir)
    problems = [Mismatch(f"refs/{name}", want, f"commit:{text}")
                for name, text in refs.items() if text != entry.commit]
    rev = entry.requested_revision
    if not is_commit_sha(rev) and rev not in refs:
        problems.append(Mismatch(f"refs/{rev}", want, "absent"))
    snaps = repo_dir / "snapshots"
    others = sorted(f"snapshots/{d.name}" for d in snaps.iterdir() if d.name != entry.commit)
    return tuple(sorted(problems)), tuple(others)
