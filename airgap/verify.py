"""Offline verification of a bundle: signature, structure, parts, content, pins.

Order of checks (every problem is collected, except that nothing in an index whose signature
fails is looked at: a hostile index costs reading at most ``MAX_INDEX_BYTES`` and one
signature check, never a parse of its lists or a look at its parts):

1. ``index.sig`` verifies over the exact bytes of ``index.json`` with a trusted public key;
2. the index parses and is structurally sound (``parse_index``: paths, layout, pins);
3. every listed part is present, a regular single-link file, of the listed size; no unlisted
   ``payload*`` file lies beside them;
4. every blob's SHA-256, streamed from the parts in parallel, equals the index (which equals
   the lockfile pin, checked in 2);
5. each part holding a bad blob (or a zlib-encoded one) is hashed whole, to name the damaged
   part (``--all-parts`` hashes every part).

Why step 5 is enough: the blobs tile the payload exactly (no gaps, no overlap, checked in 2),
so when every stored-as-is blob digest matches, those payload bytes are the signed ones and
the part digests necessarily match too; hashing the parts again would double the work on the
hot path. Encoded blobs are the exception (a decoder ignores some bits), hence their parts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from airgap.bundle import (
    INDEX_NAME,
    MAX_INDEX_BYTES,
    SIGNATURE_NAME,
    Blob,
    Index,
)
from airgap.errors import Code, Problem, VerificationFailed
from airgap.media import check_bundle_dir, check_parts, read_small
from airgap.mlbom import BOM_NAME, check_bom, read_extra
from airgap.signing import MAX_SIGNATURE_BYTES, verify_index_signature
from airgap.stream import Progress, Range, RangeResult, hash_ranges
from airgap.validate import check_expected_lock, parse_index
from weights import Lockfile


@dataclass
class VerifyReport:
    """Outcome of ``verify_bundle``.

    Attributes:
        bundle: the bundle directory.
        problems: every problem found (empty when the bundle is good).
        index: the parsed index, or None if it could not be parsed.
        signer: key id that verified the signature, or None.
        bytes_hashed: payload bytes read and hashed.
        seconds: wall time of the content check.
        cpu_seconds: CPU time of the content check, all threads (user + system).
        workers: hashing threads used.
        readable_parts: parts that passed the type and size checks.
    """

    bundle: Path
    problems: list[Problem] = field(default_factory=list)
    index: Index | None = None
    signer: str | None = None
    bytes_hashed: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    workers: int = 1
    readable_parts: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems and self.index is not None

    def raise_for_problems(self) -> None:
        """Raise ``VerificationFailed`` with every problem, if any."""
        if self.problems:
            raise VerificationFailed(self.problems)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready summary (the ``--json`` output of ``airgap verify``)."""
        idx = self.index
        return {
            "bundle": str(self.bundle),
            "ok": self.ok,
            "signer_key_id": self.signer,
            "models": [
                {"repo_id": e.repo_id, "commit": e.commit, "files": len(e.files)}
                for e in (idx.lock.entries if idx else ())
            ],
            "parts": len(idx.parts) if idx else None,
            "payload_bytes": idx.payload_size if idx else None,
            "bytes_hashed": self.bytes_hashed,
            "seconds": round(self.seconds, 3),
            "cpu_seconds": round(self.cpu_seconds, 3),
            "workers": self.workers,
            **problems_json(self.problems),
        }


#: Problems shown in full (text and ``--json``); the rest are counted. A hostile or badly
#: damaged bundle can have one problem per part (up to ``MAX_PARTS``).
MAX_SHOWN_PROBLEMS = 20


def problems_json(problems: Sequence[Problem]) -> dict[str, Any]:
    """``{"problems": first MAX_SHOWN_PROBLEMS, "problems_total": n, "problems_omitted": k}``."""
    shown = problems[:MAX_SHOWN_PROBLEMS]
    return {"problems": [p.to_json() for p in shown], "problems_total": len(problems),
            "problems_omitted": len(problems) - len(shown)}


def check_index(
    bundle: Path,
    trusted: Sequence[Ed25519PublicKey],
    *,
    expected_lock: Lockfile | None = None,
) -> VerifyReport:
    """Steps 1-3: signature, index structure, parts on the media (no payload hashing).

    Raises:
        AirgapError: ``bundle_not_found`` if ``bundle`` is not a directory.
    """
    check_bundle_dir(bundle)
    report = VerifyReport(bundle=bundle)
    try:
        index_bytes = read_small(bundle, INDEX_NAME, MAX_INDEX_BYTES, Code.INDEX_MISSING)
    except VerificationFailed as exc:
        report.problems.extend(exc.problems)
        return report
    try:
        sig_bytes = read_small(bundle, SIGNATURE_NAME, MAX_SIGNATURE_BYTES, Code.SIGNATURE_MISSING)
        report.signer = verify_index_signature(index_bytes, sig_bytes, trusted)
    except VerificationFailed as exc:
        report.problems.extend(exc.problems)
        return report  # untrusted bytes: not parsed, no part opened
    try:
        report.index = parse_index(index_bytes)
    except VerificationFailed as exc:
        report.problems.extend(exc.problems)
        return report
    if expected_lock is not None:
        for failure in check_expected_lock(report.index, expected_lock):
            report.problems.extend(failure.problems)
    part_problems, report.readable_parts = check_parts(bundle, report.index)
    report.problems.extend(part_problems)
    return report


def verify_bundle(
    bundle: Path,
    trusted: Sequence[Ed25519PublicKey],
    *,
    expected_lock: Lockfile | None = None,
    workers: int = 1,
    all_parts: bool = False,
    progress: Progress | None = None,
) -> VerifyReport:
    """Verify a bundle offline with nothing but the files and trusted public keys.

    Args:
        bundle: the bundle directory.
        trusted: accepted signer public keys.
        expected_lock: optionally, a lockfile the bundle's pins must match.
        workers: hashing threads (``stream.default_workers()`` = one per core).
        all_parts: also hash every part whole (not needed for integrity; see module doc).
        progress: called with bytes hashed.

    Returns:
        the report; ``report.ok`` is False when any problem was found.

    Raises:
        AirgapError: ``bundle_not_found`` when ``bundle`` is not a directory.
    """
    report = check_index(bundle, trusted, expected_lock=expected_lock)
    index = report.index
    if index is None:
        return report
    report.workers = workers
    started, cpu_started = time.perf_counter(), time.process_time()
    ranges = blob_ranges(index, index.blobs)
    results = hash_ranges(bundle, index, ranges, readable=report.readable_parts,
                          workers=workers, progress=progress)  # fmt: skip
    report.bytes_hashed = sum(r.range.size for r in results if r.sha256)
    report.problems.extend(
        diagnose(report, index, results, workers=workers, all_parts=all_parts, progress=progress)
    )
    if not report.problems:  # the ML-BOM's bytes are verified: now its meaning (airgap.mlbom)
        bom = read_extra(bundle, index, BOM_NAME)
        if bom is not None:
            report.problems.extend(check_bom(bom, index))
    report.seconds = time.perf_counter() - started
    report.cpu_seconds = time.process_time() - cpu_started
    return report


def extras_problems(
    bundle: Path, index: Index, report: VerifyReport, *, workers: int = 1
) -> list[Problem]:
    """What :func:`verify_bundle` finds in the blobs no model file uses (the extras: the
    ML-BOM, included files) and in the parts under them, then the ML-BOM's meaning.

    ``unpack`` calls it whether or not it installs the extras, so it refuses every bundle
    ``verify`` refuses (a doctored ML-BOM, a damaged last part holding only extras).

    Returns:
        The problems (empty when the extras are intact and the ML-BOM agrees with the index).
    """
    model_blobs = {f.sha256 for f in index.files if f.repo_id is not None}
    blobs = [b for b in index.blobs if b.sha256 not in model_blobs]
    results = hash_ranges(bundle, index, blob_ranges(index, blobs),
                          readable=report.readable_parts, workers=workers)
    problems: list[Problem] = []
    suspects: set[str] = set()
    for res in results:
        found = content_problems(index, res)
        problems.extend(found)
        if found:  # only parts under a bad extra: the model blobs are unpack's own to judge
            suspects.update(s.part.name for s in index.segments(res.range.offset, res.range.size))
    problems += _check_part_digests(report, index, suspects, workers, None) if suspects else []
    if not problems:
        bom = read_extra(bundle, index, BOM_NAME)
        if bom is not None:
            problems.extend(check_bom(bom, index))
    return problems


def blob_ranges(index: Index, blobs: Iterable[Blob]) -> list[Range]:
    """The payload ranges of ``blobs`` (keyed by sha256, with their encoding)."""
    return [Range(b.sha256, b.offset, b.stored_size, b.encoding, b.size) for b in blobs]


def content_problems(index: Index, res: RangeResult) -> list[Problem]:
    """Problems of one blob result, reported per file that uses the blob."""
    if res.problem is None and res.sha256 == res.range.key:
        return []
    labels = [f.label for f in index.files_of_blob(res.range.key)]
    if res.problem is not None and res.problem.code == Code.CONTENT_UNREADABLE:
        return [replace(res.problem, path=", ".join(labels),
                        message=f"{', '.join(labels)}: {res.problem.message}")]  # fmt: skip
    if res.problem is not None and res.problem.code != Code.CONTENT_DIGEST_MISMATCH:
        return [res.problem]
    why = res.problem.message if res.problem else "does not match its sha256"
    return [Problem(Code.CONTENT_DIGEST_MISMATCH,
                    f"{label}: content reassembled from the parts {why.split(': ', 1)[-1]}",
                    path=label, expected=res.range.key,
                    actual=res.sha256 or "undecodable") for label in labels]  # fmt: skip


def diagnose(
    report: VerifyReport,
    index: Index,
    results: Sequence[RangeResult],
    *,
    workers: int,
    all_parts: bool = False,
    progress: Progress | None = None,
) -> list[Problem]:
    """Problems of the blob results, plus the damaged parts named (step 5 of the module doc).

    Every part holding a bad, unreadable or encoded blob is hashed whole (every part if
    ``all_parts``).
    """
    problems: list[Problem] = []
    suspects: set[str] = set()
    for res in results:
        found = content_problems(index, res)
        problems.extend(found)
        # An encoded blob's stored bytes are not fixed by its content digest (deflate ignores
        # some bits), so the parts under it are always hashed too; they are small.
        if found or res.range.encoding != "identity":
            suspects.update(s.part.name for s in index.segments(res.range.offset, res.range.size))
    names = None if all_parts else suspects
    return problems + _check_part_digests(report, index, names, workers, progress)


def _check_part_digests(
    report: VerifyReport,
    index: Index,
    names: set[str] | None,
    workers: int,
    progress: Progress | None,
) -> list[Problem]:
    """Hash whole parts (``names``, or all when None) and report those whose digest differs."""
    parts = [p for p in index.parts if (names is None or p.name in names)
             and p.name in report.readable_parts]  # fmt: skip
    if not parts:
        return []
    ranges = [Range(p.name, p.offset, p.size) for p in parts]
    results = hash_ranges(report.bundle, index, ranges, readable=report.readable_parts,
                          workers=workers, progress=progress)  # fmt: skip
    report.bytes_hashed += sum(r.range.size for r in results if r.sha256)
    problems: list[Problem] = []
    for part, res in zip(parts, results, strict=True):
        if res.problem is not None:
            problems.append(res.problem)
        elif res.sha256 != part.sha256:
            problems.append(Problem(
                Code.PART_DIGEST_MISMATCH,
                f"part {part.name} is damaged (sha256 differs): re-copy this part",
                part=part.name, expected=part.sha256, actual=res.sha256))  # fmt: skip
    return problems
