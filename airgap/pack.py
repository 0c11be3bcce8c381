"""Pack pinned, verified weights (and extra files) into a signed bundle.

The bytes are checked against the lockfile pins as they are copied (``payload.py``): the
digest is of the very bytes written, so a file that changes under us cannot slip in. A size
check of every source runs before anything is written. The bundle is built in a fresh
temporary directory next to ``out`` and renamed into place only when complete and signed, so
no stale part of an earlier run can mix in.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from airgap import leftovers, paths
from airgap.bundle import (
    DEFAULT_PART_SIZE,
    INDEX_NAME,
    MAX_PARTS,
    SIGNATURE_NAME,
    Base,
    ContentFile,
    Index,
)
from airgap.delta import read_base, split_sources
from airgap.errors import AirgapError, Code, fail
from airgap.formats import check_pack_sources
from airgap.mlbom import BOM_NAME, build_bom
from airgap.payload import Source, write_blobs
from airgap.signing import key_id, sign_index
from airgap.space import require_free, require_parent_dir, writing
from airgap.stream import Progress
from airgap.validate import parse_index
from airgap.version import __version__
from weights import (
    DEFAULT_POLICY,
    LockEntry,
    Lockfile,
    SerialisationPolicy,
    UnsafeTreeError,
    WeightsError,
    check_model_file,
    resolve_model_dir,
    sha256_file,
)

#: Room kept for index.json and index.sig in the free-space check, in bytes.
INDEX_ALLOWANCE = 1024**2


@dataclass(frozen=True)
class PackReport:
    """Outcome of ``pack_bundle``: the bundle path, its index and the signer key id."""

    bundle: Path
    index: Index
    signer: str
    seconds: float
    leftovers_removed: tuple[Path, ...] = ()  # work directories of killed earlier packs


def collect_sources(
    lock: Lockfile, source: Path, include_files: Sequence[Path] = ()
) -> list[Source]:
    """Find every pinned file under ``source`` and check it exists with the pinned size.

    ``source`` is a Hugging Face cache root (snapshot of the pinned commit), a snapshot or
    model directory (one model), or a directory with one ``org/name`` sub-directory per model.

    Raises:
        AirgapError: ``source_missing`` (a file is missing or not a regular file),
            ``empty_model`` or ``pin_mismatch`` (a size differs), ``unsafe_path``.
    """
    if not lock.entries:
        raise fail(Code.EMPTY_MODEL, "the lockfile pins no model")
    out: list[Source] = []
    for entry in lock.entries:
        if not entry.files:
            raise fail(Code.EMPTY_MODEL, f"model {entry.repo_id} pins no files")
        root = _model_root(source, entry)
        for pin in entry.files:
            paths.check_path(pin.path, what=f"pinned path of {entry.repo_id}")
            origin = root / pin.path
            if os.path.lexists(origin):
                _check_tree_rule(root, entry.repo_id, pin.path)
            _check_source(origin, pin.size, f"{entry.repo_id}:{pin.path}")
            cf = ContentFile(entry.repo_id, pin.path, pin.size, pin.sha256, pin.blob_id)
            out.append(Source(cf, origin, None if pin.lfs else pin.git_sha1))
        paths.check_tree((f.path for f in entry.files), where=entry.repo_id)
    names: set[str] = set()
    for extra in include_files:
        name = paths.check_path(extra.name, what="included file name")
        if name == BOM_NAME:
            raise AirgapError(Code.IO_ERROR, f"{extra}: {BOM_NAME} is the name of the bundle's "
                              "ML-BOM; rename the included file")
        if name in names:
            raise AirgapError(Code.IO_ERROR, f"two included files are named {name!r}")
        names.add(name)
        size = _check_source(extra, None, str(extra))
        try:  # extras are small and unpinned: their digest is taken now, re-checked on copy
            sha = sha256_file(extra)
        except WeightsError as exc:
            raise AirgapError(Code.SOURCE_MISSING, str(exc)) from exc
        out.append(Source(ContentFile(None, name, size, sha, sha), extra, None))
    return out


def _model_root(source: Path, entry: LockEntry) -> Path:
    nested = source / entry.repo_id
    if nested.is_dir():  # a directory of models laid out as org/name
        source = nested
    try:
        return resolve_model_dir(source, entry)
    except WeightsError as exc:
        raise AirgapError(Code.SOURCE_MISSING, f"{entry.repo_id}: {exc}") from exc


def _check_tree_rule(root: Path, repo_id: str, path: str) -> None:
    """The tree rule lock, verify and sign apply (:func:`weights.check_model_file`): no
    symlink out of the model, to a directory, or in a loop."""
    try:
        check_model_file(root, path)
    except UnsafeTreeError as exc:
        if exc.code in ("dangling_symlink", "not_regular_file"):
            raise AirgapError(Code.SOURCE_MISSING, f"{repo_id}: {exc.message}") from exc
        raise fail(Code.UNSAFE_PATH, f"{repo_id}: {exc.message} [{exc.code}]",
                   path=f"{repo_id}:{path}") from exc


def _check_source(path: Path, size: int | None, label: str) -> int:
    try:
        st = path.stat()  # follows symlinks: HF snapshots link into blobs/
    except OSError as exc:
        raise AirgapError(Code.SOURCE_MISSING, f"{label}: cannot read {path}: {exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise AirgapError(Code.SOURCE_MISSING, f"{label}: {path} is not a regular file")
    if size is not None and st.st_size != size:
        raise fail(Code.PIN_MISMATCH, f"{label}: {path} has {st.st_size} bytes, pinned {size}",
                   path=label, expected=str(size), actual=str(st.st_size))  # fmt: skip
    return st.st_size


def pack_bundle(
    lock: Lockfile,
    source: Path,
    out: Path,
    key: Ed25519PrivateKey,
    *,
    include_files: Sequence[Path] = (),
    part_size: int = DEFAULT_PART_SIZE,
    force: bool = False,
    compress: bool = False,
    progress: Progress | None = None,
    policy: SerialisationPolicy = DEFAULT_POLICY,
    since: Path | None = None,
) -> PackReport:
    """Pack the lockfile's models from ``source`` into a new signed bundle at ``out``.

    Args:
        lock: the pins (every model in it is packed).
        source: where the files are (see ``collect_sources``).
        out: bundle directory to create; must not exist unless ``force``.
        key: Ed25519 signing key.
        include_files: extra files (policy, chart archive) carried by name, unpinned.
        part_size: maximum part size in bytes (default 4 GiB - 1, the FAT32 limit).
        force: replace an existing bundle at ``out`` (only after the new one is complete).
        compress: zlib-encode blobs that shrink by at least 5 % (off by default: weights do
            not compress; tokenizers and configs do).
        progress: called with the number of bytes copied.
        policy: serialisation policy (``airgap.formats``): pickle-based files are refused
            unless allowed and scanned safe; verdicts go into the index's lock.
        since: a base bundle's ``index.json`` (or directory): pack a delta that leaves out
            the content the base already carried for each model (``airgap.delta``).

    Raises:
        AirgapError: ``output_exists``, ``source_missing``, ``io_error``.
        VerificationFailed: ``pin_mismatch`` (source bytes differ from the pins; nothing is
            left behind), ``empty_model``, ``unsafe_path``, ``path_collision``,
            ``unsafe_serialisation`` (before anything is written).
    """
    if part_size < 1:
        raise AirgapError(Code.IO_ERROR, "--part-size must be at least 1 byte")
    if (out.exists() or out.is_symlink()) and not force:
        raise AirgapError(Code.OUTPUT_EXISTS, f"{out} exists; choose a new path or use --force")
    require_parent_dir(out, "--out")
    started = time.perf_counter()
    sources = collect_sources(lock, source, include_files)
    lock, formats = check_pack_sources(
        lock, {(s.file.repo_id, s.file.path): s.origin for s in sources if s.file.repo_id},
        policy)
    shipped, base = sources, None
    if since is not None:
        shipped, base = split_sources(sources, *read_base(since))
    payload = sum({s.file.sha256: s.file.size for s in shipped}.values())  # stored once each
    parts = -(-payload // part_size)
    if parts > MAX_PARTS:
        least = -(-payload // MAX_PARTS)
        raise AirgapError(Code.IO_ERROR, f"--part-size {part_size} would split {payload} bytes "
                          f"into {parts} parts (at most {MAX_PARTS}); use at least {least}")
    removed: list[Path] = []
    # What a killed pack (SIGKILL, power cut) left: not resumable.
    for old in leftovers.dead(out.parent, f".{glob.escape(out.name)}.*.partial"):
        shutil.rmtree(old, ignore_errors=True)
        removed.append(old)
    require_free(out.parent, payload + INDEX_ALLOWANCE, f"packing into {out}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        with leftovers.held(tmp):
            index = _pack_into(tmp, out, lock, sources, key, part_size, compress, force,
                               progress, shipped=shipped, base=base, formats=formats)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PackReport(out, index, key_id(key.public_key()), time.perf_counter() - started,
                      leftovers_removed=tuple(removed))


def _pack_into(
    tmp: Path,
    out: Path,
    lock: Lockfile,
    sources: list[Source],
    key: Ed25519PrivateKey,
    part_size: int,
    compress: bool,
    force: bool,
    progress: Progress | None,
    *,
    shipped: list[Source],
    base: Base | None,
    formats: dict[tuple[str, str], str],
) -> Index:
    """Build, check, sign and move the bundle into place (``tmp`` is removed by the caller
    on any failure)."""
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would make the bundle unreadable to others
    index = _build_index(tmp, lock, sources, part_size, compress, progress,
                         shipped=shipped, base=base, formats=formats)
    data = index.dumps()
    parse_index(data)  # never sign an index that our own verifier would reject
    _write_file(tmp / INDEX_NAME, data)
    _write_file(tmp / SIGNATURE_NAME, sign_index(data, key))
    _fsync_dir(tmp)
    _replace_dir(tmp, out, force=force)
    return index


def _build_index(
    tmp: Path,
    lock: Lockfile,
    sources: list[Source],
    part_size: int,
    compress: bool,
    progress: Progress | None,
    *,
    shipped: list[Source],
    base: Base | None,
    formats: dict[tuple[str, str], str],
) -> Index:
    tool = f"sovereign-gateway airgap {__version__}"
    created_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    bom = _bom_source(tmp / f".{BOM_NAME}", build_bom(lock, formats, created_at, tool))
    sources, shipped = [*sources, bom], [*shipped, bom]
    try:
        blobs, parts = write_blobs(tmp, shipped, part_size, compress=compress, progress=progress)
    finally:
        bom.origin.unlink(missing_ok=True)
    return Index(
        tool=tool,
        created_at=created_at,
        compression="zlib" if compress else "none",
        part_size=part_size,
        payload_size=sum(b.stored_size for b in blobs),
        lock=lock,
        files=tuple(s.file for s in sources),
        blobs=tuple(blobs),
        parts=parts,
        base=base,
    )


def _bom_source(path: Path, data: bytes) -> Source:
    """The ML-BOM as an extra file to pack (written beside the parts, removed after)."""
    _write_file(path, data)
    sha = hashlib.sha256(data).hexdigest()
    return Source(ContentFile(None, BOM_NAME, len(data), sha, sha), path, None)


def _write_file(path: Path, data: bytes) -> None:
    with writing(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace_dir(tmp: Path, out: Path, *, force: bool) -> None:
    old: Path | None = None
    if out.exists() or out.is_symlink():
        if not force:
            raise AirgapError(Code.OUTPUT_EXISTS, f"{out} appeared while packing")
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.rename(out, old)
    os.rename(tmp, out)
    _fsync_dir(out.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()

