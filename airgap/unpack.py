"""Install a verified bundle into a Hugging Face cache or a plain directory, atomically.

Plan -> stage -> commit:

1. *check*: signature, index structure and parts (``verify.check_index``); any problem stops
   here and nothing is written.
2. *plan*: for every file, where it goes; blobs already in the store are hashed and skipped
   when they match (re-runs are cheap); an existing entry that differs is a conflict (a
   damaged blob of the same id is repaired instead). Every directory on the way must be a real
   directory, never a symlink.
3. *stage*: blobs are streamed from the parts into a staging directory inside STORE (same file
   system, so the final renames are atomic), hashed on the way and fsynced. The run holds a
   ``flock`` on it; blobs staged by a killed earlier run (a ``.airgap-staging-*`` whose lock is
   free) are hashed again and reused when they match, and its directory is removed
   (:mod:`airgap.leftovers`). A digest mismatch
   deletes the staging directory and reports every bad blob: the store is untouched. Hashing
   the bytes actually installed (rather than verifying first and copying after) also closes
   the window in which media could change between a verify and a copy.
4. *commit*: directories, blobs, snapshot symlinks, then refs last, each by ``rename``; a
   failure undoes what was already done, in reverse order (:mod:`airgap.install`, with the
   staging file writer and the reuse of a killed run's staged blobs).

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
from airgap.install import Plan, StagedFile, commit, resume
from airgap.space import require_free
from airgap.stream import Progress, Range, hash_ranges
from airgap.verify import VerifyReport, blob_ranges, check_index, diagnose, extras_problems
from weights import (
    DEFAULT_POLICY,
    Lockfile,
    SerialisationPolicy,
    WeightsError,
    existing_twin,
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
) -> UnpackReport:
    """Verify ``bundle`` and install its models into ``store``; all or nothing.

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

    Returns:
        what was installed, skipped and repaired.

    Raises:
        VerificationFailed: the bundle failed any check (``delta_base_missing``: a delta's
            base content is not in the store); the store is unchanged.
        StoreError: ``store_unsafe`` (a symlink or non-directory on the way) or
            ``store_conflict`` (different content already at a target); the store is unchanged.
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
                        progress, started, policy)
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
    policy: SerialisationPolicy = DEFAULT_POLICY,
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
    plan = Plan()
    for entry in index.lock.entries:
        _refuse_twin(store, entry.repo_id, layout)
    for entry in index.lock.entries:
        files = index.model_files(entry.repo_id)
        if layout == "hf-cache":
            report.locations[entry.repo_id] = _plan_hf(plan, report, store, entry.repo_id,
                                                       entry.commit, entry.requested_revision,
                                                       files)  # fmt: skip
        else:
            root = store / entry.repo_id
            for f in files:
                _plan_file(plan, report, store, root / f.path, f)
            report.locations[entry.repo_id] = root
    if extras_into is not None:
        for f in index.extras:
            _plan_file(plan, report, extras_into, extras_into / f.path, f)
    staging = Path(tempfile.mkdtemp(prefix=".airgap-staging-", dir=store))
    try:
        with leftovers.held(staging):
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


def _refuse_twin(store: Path, repo_id: str, layout: Layout) -> None:
    """Refuse a model whose folder the store already holds under another spelling.

    ``ORG/Tiny`` next to ``org/tiny`` is one repository on the Hub and one folder on a
    case-folding disk (:mod:`weights.installpaths`).
    """
    relative = repo_folder_name(repo_id) if layout == "hf-cache" else repo_id
    twin = existing_twin(store, relative)
    if twin is not None:
        raise StoreError(Code.STORE_CONFLICT, f"{repo_id} would install to {store / relative}, "
                         f"but the store holds {twin}, the same name when case and Unicode "
                         "normalisation are ignored; unpack with the repo id spelled as "
                         "installed, or remove the other copy")  # fmt: skip


def _read_ref(ref: Path) -> str | None:
    """The commit an existing ref file names (None if absent or unreadable)."""
    try:
        return ref.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _plan_hf(
    plan: Plan,
    report: UnpackReport,
    store: Path,
    repo_id: str,
    commit: str,
    revision: str,
    files: list[ContentFile],
) -> Path:
    paths = hf_cache_paths(store, repo_id)
    snapshot = paths.snapshot(commit)
    planned: set[Path] = set()
    for f in files:
        blob = paths.blob(f.blob_id)
        if blob not in planned:
            planned.add(blob)
            _plan_file(plan, report, store, blob, f, repairable=True)
        link = snapshot / f.path
        target = os.path.relpath(blob, link.parent)
        _check_dirs(store, link.parent)
        try:
            st = os.lstat(link)
        except FileNotFoundError:
            plan.links.append((link, target))
            continue
        if stat.S_ISLNK(st.st_mode) and os.readlink(link) == target:
            continue
        if stat.S_ISREG(st.st_mode) and _digest(link) == f.sha256:
            continue
        raise StoreError(Code.STORE_CONFLICT, f"{link} exists with other content; "
                         "remove it to install this bundle")  # fmt: skip
    if not is_commit_sha(revision):
        ref = paths.refs / revision
        _check_dirs(store, ref.parent)
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
    _check_dirs(root, final.parent)
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


def _check_dirs(root: Path, directory: Path) -> None:
    """Every existing component from ``root`` down to ``directory`` must be a real directory."""
    rel = directory.relative_to(root)
    cur = root
    for comp in rel.parts:
        cur = cur / comp
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
            raise StoreError(Code.STORE_UNSAFE, f"{cur} is {kind}; refusing to write through it")


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


