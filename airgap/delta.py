"""Delta bundles: ship only the content the far side does not have (``pack --since``).

The packer reads the index of a bundle the far side already installed (the *base*). A model
file whose content the base already carried for the same model is left out of the payload and
listed in the new index's ``base.blobs`` instead; every file of the new revision is still
listed in ``files`` and pinned in ``lock``, so the far side installs and verifies the new
revision whole. Extras are always shipped (they are not kept in the store).

Before anything is written, ``unpack`` checks that the store holds every base blob of every
model, byte for byte (sha256 of the blob file in the Hugging Face cache layout); a missing or
different one is refused with ``delta_base_missing`` naming each. Deltas install into the
``hf-cache`` layout only: a plain directory keeps one revision per path, so it cannot hold
the base next to the new revision.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from airgap.bundle import INDEX_NAME, MAX_INDEX_BYTES, Base, BaseBlob, Index
from airgap.errors import AirgapError, Code, Problem, VerificationFailed
from airgap.payload import Source
from airgap.validate import parse_index
from weights import WeightsError, hf_cache_paths, sha256_file


def read_base(path: Path) -> tuple[str, Index]:
    """Read the base bundle's index (``index.json`` or the bundle directory holding it).

    Returns:
        (hex sha256 of the index bytes, the parsed index).

    Raises:
        AirgapError: ``io_error`` (unreadable, too large).
        VerificationFailed: the index is malformed.
    """
    file = path / INDEX_NAME if path.is_dir() else path
    try:
        with file.open("rb") as fh:
            data = fh.read(MAX_INDEX_BYTES + 1)
    except OSError as exc:
        raise AirgapError(Code.IO_ERROR, f"--since {file}: {exc.strerror or exc}") from exc
    if len(data) > MAX_INDEX_BYTES:
        raise AirgapError(Code.IO_ERROR, f"--since {file}: larger than {MAX_INDEX_BYTES} bytes")
    return hashlib.sha256(data).hexdigest(), parse_index(data)


def split_sources(
    sources: Sequence[Source], base_sha256: str, base_index: Index
) -> tuple[list[Source], Base | None]:
    """Which sources to ship, and the ``base`` section for the rest.

    Returns:
        (sources to ship, ``Base`` or None when the base shares nothing with the new content).

    Raises:
        AirgapError: ``io_error`` when nothing at all would be shipped.
    """
    have = {(f.repo_id, f.sha256) for f in base_index.files if f.repo_id is not None}
    shipped: list[Source] = []
    base: dict[str, BaseBlob] = {}
    for s in sources:
        if s.file.repo_id is not None and (s.file.repo_id, s.file.sha256) in have:
            base.setdefault(s.file.sha256, BaseBlob(s.file.sha256, s.file.size))
        else:
            shipped.append(s)
    shipped_shas = {s.file.sha256 for s in shipped}
    for sha in [b for b in base if b in shipped_shas]:  # needed by another model: shipped anyway
        del base[sha]
    if not shipped:
        raise AirgapError(Code.IO_ERROR, "nothing changed since the base bundle: every file "
                          "is already on the far side; no delta to pack")
    if not base:
        return shipped, None
    return shipped, Base(base_sha256, tuple(base.values()))


def check_base_in_store(index: Index, store: Path, layout: str) -> None:
    """Refuse a delta bundle unless ``store`` holds every base blob it relies on.

    Raises:
        VerificationFailed: ``delta_base_missing`` listing every missing or different blob;
            also when ``layout`` is not ``hf-cache``.
    """
    if index.base is None:
        return
    if layout != "hf-cache":
        raise VerificationFailed([Problem(str(Code.DELTA_BASE_MISSING),
                                          "a delta bundle installs into the hf-cache layout "
                                          "only (the base revision lives in its blobs)")])
    base = {b.sha256 for b in index.base.blobs}
    problems: list[Problem] = []
    checked: dict[Path, str | None] = {}
    for f in index.files:
        if f.repo_id is None or f.sha256 not in base:
            continue
        blob = hf_cache_paths(store, f.repo_id).blob(f.blob_id)
        if blob not in checked:
            checked[blob] = _content_sha256(blob, f.size)
        actual = checked[blob]
        if actual != f.sha256:
            what = "missing" if actual is None else "holds other content"
            problems.append(Problem(
                str(Code.DELTA_BASE_MISSING),
                f"{f.label}: base blob {blob} {what}; install the base bundle first "
                f"(index sha256 {index.base.index_sha256[:16]}) or ship a full bundle",
                path=f.label, expected=f.sha256, actual=actual))
    if problems:
        raise VerificationFailed(problems)


def _content_sha256(blob: Path, size: int) -> str | None:
    """sha256 of a regular file of ``size`` bytes at ``blob``; None if absent or not that."""
    try:
        st = os.lstat(blob)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        return None if not stat.S_ISREG(st.st_mode) else f"size {st.st_size}"
    try:
        return sha256_file(blob)
    except WeightsError:
        return None


__all__ = ["check_base_in_store", "read_base", "split_sources"]
