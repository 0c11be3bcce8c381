"""Install a verified bundle into a Hugging Face cache or a plain directory, atomically.

Plan -> stage -> commit:

1. *check*: signature, index structure and parts (``verify.check_index``); any problem stops
   here and nothing is written.
2. *plan*: for every file, where it goes; blobs already in the store are hashed and skipped
   when they match (re-runs are cheap; a damaged blob of the same id is repaired). Each model
   directory (``dir``) or snapshot (``hf-cache``) is left alone when it already holds exactly
   the bundle's files, else built whole in staging: one that holds anything the bundle does
   not carry, or other content at its paths, is refused (``store_conflict``, every entry
   named; :mod:`airgap.target`) unless ``replace`` is asked for. Every directory on the way
   must be a real directory, never a symlink.
3. *stage*: blobs are streamed from the parts into a staging directory inside STORE (same file
   system, so the final renames are atomic), hashed on the way and fsynced. The run holds a
   ``flock`` on it; blobs staged by a killed earlier run (a ``.airgap-staging-*`` whose lock is
   free) are hashed again and reused when they match, and its directory is removed
   (:mod:`airgap.leftovers`). A digest mismatch
   deletes the staging directory and reports every bad blob: the store is untouched. Hashing
   the bytes actually installed (rather than verifying first and copying after) also closes
   the window in which media could change between a verify and a copy.
4. *commit*: blobs, then each staged model directory or snapshot published by one
   ``rename`` (a loader, or a kill, never sees one part-written under its final name), then
   refs last; a failure undoes what was already done, in reverse order
   (:mod:`airgap.install`, with the staging file writer and the reuse of a killed run's
   staged blobs).

Layouts (``hf-cache`` is what ``huggingface_hub`` and vLLM read with ``HF_HUB_OFFLINE=1``)::

    hf-cache   STORE/models--{org}--{name}/blobs/<blob_id>
               STORE/models--{org}--{name}/snapshots/<commit>/<path> -> ../../blobs/<blob_id>
               STORE/models--{org}--{name}/refs/<requested revision>   (commit, no newline)
    dir        STORE/{org}/{name}/<path>   (regular files)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from airgap import leftovers
from airgap.bundle import ContentFile, Index
from airgap.delta import check_base_in_store
from airgap.errors import AirgapError, Code, StoreError, VerificationFailed
from airgap.formats import check_index_formats, check_staged_formats
from airgap.install import Plan, StagedFile, Tree, commit, resume
from airgap.space import require_free
from airgap.stream import Progress, Range, hash_ranges
from airgap.target import Want, admit, check_dirs, refuse_twin, survey
from airgap.verify import VerifyReport, blob_ranges, check_index, diagnose, extras_problems
from weights import (
    DEFAULT_POLICY,
    Lockfile,
    SerialisationPolicy,
    WeightsError,
    hf_cache_paths,
    is_commit_sha,
    repo_folder_name,
    sha256_file,
)

Layout = Literal["hf-cache", "dir"]


@dataclass
class UnpackReport:
    """Outcome of ``unpack_bundle``.

    Attributes:
        store: the store root.
        layout: ``hf-cache`` or ``dir``.
        locations: per model repo id, where it is now (snapshot or model directory).
        written: content files newly written (blobs in hf-cache layout).
        skipped: already present and verified, left untouched.
        repaired: present but damaged, replaced by the verified content.
        bytes_written: bytes streamed from the bundle into the store.
        seconds: wall time.
        refs_moved: ``repo_id@revision`` -> (old commit, new commit) for every
            ``refs/<revision>`` that pointed at another commit before (hf-cache layout; the
            old snapshot is kept).
        resumed: blobs taken (after hashing them again) from the staging directory of a
            killed earlier unpack instead of being streamed from the bundle again.
        leftovers_removed: staging directories of killed earlier unpacks, now removed.
        replaced: per model repo id, the entries its existing directory (or snapshot) held
            that the bundle does not carry or carries with other content, removed because
            ``replace`` was asked for.
    """

    store: Path
    layout: Layout
    check: VerifyReport
    locations: dict[str, Path] = field(default_factory=dict)
    written: int = 0
    skipped: int = 0
    repaired: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    refs_moved: dict[str, tuple[str, str]] = field(default_factory=dict)
    resumed: int = 0
    leftovers_removed: list[Path] = field(default_factory=list)
    replaced: dict[str, list[str]] = field(default_factory=dict)


def unpack_bundle(
    bundle: Path,
    trusted: Sequence[Ed25519PublicKey],
    store: Path,
    *,
    layout: Layout = "hf-cache",
    extras_into: Path | None = None,
    expected_lock: Lockfile | None = None,
    workers: int = 1,
    progress: Progress | None = None,
    policy: SerialisationPolicy = DEFAULT_POLICY,
    replace: bool = False,
) -> UnpackReport:
    """Verify ``bundle`` and install its models into ``store``; all or nothing.

    After it, each model's directory (``dir`` layout) or snapshot (``hf-cache``) holds exactly
    the bundle's files, and was published whole by one rename.

    Args:
        bundle: the bundle directory.
        trusted: accepted signer public keys.
        store: cache root (``HF_HUB_CACHE``) or plain directory; created if absent.
        layout: ``hf-cache`` or ``dir`` (see module doc).
        extras_into: where to put the bundle's extra files (same file system as ``store``);
            None leaves them in the bundle.
        expected_lock: optionally, a lockfile the bundle's pins must match.
        workers: hashing threads.
        progress: called with bytes streamed.
        policy: serialisation policy, applied to the signed index before anything is
            written (``airgap.formats.check_index_formats``).
        replace: a model directory or snapshot that holds files the bundle does not carry,
            or other content at its paths, is replaced whole (its entries are listed in
            ``UnpackReport.replaced``) instead of refused.

    Returns:
        what was installed, skipped and repaired.

    Raises:
        VerificationFailed: the bundle failed any check (``delta_base_missing``: a delta's
            base content is not in the store); the store is unchanged.
        StoreError: ``store_unsafe`` (a symlink or non-directory on the way) or
            ``store_conflict`` (a model directory or snapshot holding files the bundle does
            not carry or other content at its paths, all in ``paths``, and ``replace`` not
            given; other content at an extra file's path); the store is unchanged.
        AirgapError: ``bundle_not_found``, ``io_error``.
    """
    started = time.perf_counter()
    check = check_index(bundle, trusted, expected_lock=expected_lock)
    check.raise_for_problems()
    index = check.index
    assert index is not None
    check_index_formats(index, policy)
    extras = extras_problems(bundle, index, check, workers=workers)  # as verify does
    if extras:
        raise VerificationFailed(extras)
    check_base_in_store(index, store, layout)  # a delta: its base must be there, verified
    report = UnpackReport(store=store, layout=layout, check=check)
    # Every directory this run will create, parents included, deepest first.
    created = sorted({m for d in (store, extras_into) if d is not None for m in _missing(d)},
                     key=lambda p: len(p.parts), reverse=True)
    try:
        return _install(bundle, index, check, report, store, layout, extras_into, workers,
                        progress, started, policy, replace)
    except BaseException:
        for d in created:  # a failed unpack leaves no new empty directory behind either
            with contextlib.suppress(OSError):
                d.rmdir()
        raise


def _missing(directory: Path) -> list[Path]:
    """``directory`` and its ancestors that do not exist yet."""
    out = []
    d = directory.absolute()
    while not os.path.lexists(d) and d != d.parent:
        out.append(d)
        d = d.parent
    return out


def _install(
    bundle: Path,
    index: Index,
    check: VerifyReport,
    report: UnpackReport,
    store: Path,
    layout: Layout,
    extras_into: Path | None,
    workers: int,
    progress: Progress | None,
    started: float,
    policy: SerialisationPolicy,
    replace: bool,
) -> UnpackReport:
    try:
        store.mkdir(parents=True, exist_ok=True)
        if extras_into is not None:
            extras_into.mkdir(parents=True, exist_ok=True)
            if extras_into.stat().st_dev != store.stat().st_dev:
                raise AirgapError(Code.IO_ERROR, f"{extras_into} must be on the file system "
                                  f"of {store} (atomic renames)")  # fmt: skip
    except OSError as exc:
        raise AirgapError(Code.IO_ERROR, f"cannot create {exc.filename}: {exc.strerror}") from exc
    for entry in index.lock.entries:
        refuse_twin(store, repo_folder_name(entry.repo_id) if layout == "hf-cache"
                    else entry.repo_id, entry.repo_id)
    staging = Path(tempfile.mkdtemp(prefix=".airgap-staging-", dir=store))
    try:
        with leftovers.held(staging):
            plan = Plan()
            for n, entry in enumerate(index.lock.entries):
                files = index.model_files(entry.repo_id)
                tree = staging / f"tree-{n}"  # the model's directory or snapshot, built whole
                if layout == "hf-cache":
                    where = _plan_hf(plan, report, store, entry.repo_id, entry.commit,
                                     entry.requested_revision, files, tree, replace)
                else:
                    where = _plan_dir(plan, report, store, entry.repo_id, files, tree, replace)
                report.locations[entry.repo_id] = where
            if extras_into is not None:
                for f in index.extras:
                    _plan_file(plan, report, extras_into, extras_into / f.path, f)
            resumed, removed = resume(store, staging, plan, _digest)
            report.resumed, report.leftovers_removed = len(resumed), removed
            require_free(store, sum(plan.sizes[s] for s in plan.targets if s not in resumed),
                         f"unpacking {bundle}")
            staged = _stage(bundle, index, check, plan, staging, workers, progress, resumed)
            check_staged_formats(index, staged, policy)  # content, before anything is committed
            report.bytes_written = sum(plan.sizes[s] for s in staged if s not in resumed)
            commit(plan, staged, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report.written = sum(len(v) for v in plan.targets.values()) - report.repaired
    report.seconds = time.perf_counter() - started
    return report


def _read_ref(ref: Path) -> str | None:
    """The commit an existing ref file names (None if absent or unreadable)."""
    try:
        return ref.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _plan_dir(
    plan: Plan,
    report: UnpackReport,
    store: Path,
    repo_id: str,
    files: list[ContentFile],
    tree: Path,
    replace: bool,
) -> Path:
    """Plan the model directory ``STORE/org/name``: kept if it holds exactly ``files``, else
    built whole in ``tree`` (staging) and published in its place."""
    root = store / repo_id
    check_dirs(store, root.parent)
    found = survey(root, {f.path: Want(f.sha256, f.size) for f in files}, _digest)
    if found.complete:
        report.skipped += len(files)
        return root
    if removed := admit(found, replace, f"the directory of model {repo_id}"):
        report.replaced[repo_id] = removed
    tree.mkdir()
    plan.trees.append(Tree(tree, root, replace=found.exists))
    for f in files:
        plan.want(f, tree / f.path)
    return root


def _plan_hf(
    plan: Plan,
    report: UnpackReport,
    store: Path,
    repo_id: str,
    commit: str,
    revision: str,
    files: list[ContentFile],
    tree: Path,
    replace: bool,
) -> Path:
    """Plan the blobs (each kept, repaired or added), the snapshot (kept if it holds exactly
    the bundle's links, else built whole in ``tree`` and published in its place) and the ref."""
    paths = hf_cache_paths(store, repo_id)
    snapshot = paths.snapshot(commit)
    planned: set[Path] = set()
    wanted: dict[str, Want] = {}
    for f in files:
        blob = paths.blob(f.blob_id)
        if blob not in planned:
            planned.add(blob)
            _plan_file(plan, report, store, blob, f, repairable=True)
        link = os.path.relpath(blob, (snapshot / f.path).parent)
        wanted[f.path] = Want(f.sha256, f.size, link)
    check_dirs(store, snapshot.parent)
    found = survey(snapshot, wanted, _digest)
    if not found.complete:
        if removed := admit(found, replace, f"snapshot {commit} of model {repo_id}"):
            report.replaced[repo_id] = removed
        tree.mkdir()
        plan.trees.append(Tree(tree, snapshot, replace=found.exists))
        for path, want in wanted.items():
            assert want.link is not None
            plan.links.append((tree / path, want.link))
    if not is_commit_sha(revision):
        ref = paths.refs / revision
        check_dirs(store, ref.parent)
        if os.path.lexists(ref) and not stat.S_ISREG(os.lstat(ref).st_mode):
            raise StoreError(Code.STORE_UNSAFE, f"{ref} is not a regular file")
        previous = _read_ref(ref)
        if previous is not None and previous != commit:
            report.refs_moved[f"{repo_id}@{revision}"] = (previous, commit)
        plan.refs.append((ref, commit))
    return snapshot


def _plan_file(
    plan: Plan,
    report: UnpackReport,
    root: Path,
    final: Path,
    f: ContentFile,
    *,
    repairable: bool = False,
) -> None:
    """Plan one content file at ``final``: skip it if present and verified, else stage it.

    ``repairable``: ``final`` is a content-addressed cache blob, so other bytes there are
    damage to repair; anywhere else they are someone's file (``store_conflict``).
    """
    check_dirs(root, final.parent)
    try:
        st = os.lstat(final)
    except FileNotFoundError:
        plan.want(f, final)
        return
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(Code.STORE_UNSAFE, f"{final} exists and is not a regular file")
    if st.st_size == f.size and _digest(final) == f.sha256:
        report.skipped += 1
        return
    if not repairable:
        raise StoreError(Code.STORE_CONFLICT, f"{final} exists with other content; "
                         "remove it or unpack elsewhere")  # fmt: skip
    plan.replace.add(final)
    report.repaired += 1
    plan.want(f, final)


def _digest(path: Path) -> str:
    try:
        return sha256_file(path)
    except WeightsError as exc:
        raise AirgapError(Code.IO_ERROR, str(exc)) from exc


def _stage(
    bundle: Path,
    index: Index,
    check: VerifyReport,
    plan: Plan,
    staging: Path,
    workers: int,
    progress: Progress | None,
    resumed: set[str],
) -> dict[str, Path]:
    """Stream the needed blobs (except ``resumed`` ones, staged already) into ``staging``;
    returns sha256 -> staged file.

    Raises:
        VerificationFailed: any blob is unreadable or differs (staging is then discarded).
    """
    ranges = blob_ranges(index, [b for b in index.blobs
                                 if b.sha256 in plan.targets and b.sha256 not in resumed])
    staged = {s: staging / f"blob-{s}" for s in plan.targets}

    def sink(rng: Range) -> StagedFile:
        return StagedFile(staged[rng.key])

    results = hash_ranges(bundle, index, ranges, readable=check.readable_parts,
                          workers=workers, sink=sink, progress=progress)  # fmt: skip
    problems = diagnose(check, index, results, workers=workers)
    if problems:
        raise VerificationFailed(problems)
    return staged


