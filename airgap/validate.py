"""Strict validation of ``index.json`` (format version 1, docs/bundle-format.md).

Every check raises ``VerificationFailed`` with its stable code before a single payload byte is
read: unknown format or fields, duplicate JSON keys, unsafe paths and revisions, colliding
names, overlapping or gapped parts, blobs that do not tile the payload, and content that
contradicts the carried lockfile pins.
"""

from __future__ import annotations

import json
import re
from typing import Any

from airgap import paths
from airgap.bundle import (
    COMPRESSIONS,
    ENCODINGS,
    FORMAT,
    FORMAT_VERSION,
    INDEX_NAME,
    MAX_PARTS,
    Base,
    BaseBlob,
    Blob,
    ContentFile,
    Index,
    Part,
)
from airgap.errors import Code, VerificationFailed, fail
from weights import (
    EmptyModelError,
    Lockfile,
    LockfileError,
    PathCollisionError,
    WeightsError,
    check_text,
    is_commit_sha,
)

_HEX64 = re.compile(r"[0-9a-f]{64}")
_BLOB_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")

#: Largest integer an index may hold (int64 readers of the format).
MAX_INT = 2**63 - 1


def parse_index(data: bytes) -> Index:
    """Parse and validate ``index.json`` bytes.

    Raises:
        VerificationFailed: ``index_invalid``, ``unsupported_format``, ``unsafe_path``,
            ``path_collision``, ``parts_overlap``, ``parts_gap``, ``blobs_layout``,
            ``empty_model`` or ``pin_mismatch``.
    """
    try:
        doc = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: nesting
        raise fail(Code.INDEX_INVALID, f"{INDEX_NAME} is not valid UTF-8 JSON: {exc}") from None
    return _Validator(doc).index()


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


class _Validator:
    """Walks the raw JSON document; each check raises ``VerificationFailed`` with its code."""

    def __init__(self, doc: Any) -> None:
        self.doc = doc

    @staticmethod
    def _obj(value: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise fail(Code.INDEX_INVALID, f"{INDEX_NAME}: {where} is not an object")
        missing = [k for k in keys if k not in value]
        extra = sorted(set(value) - set(keys))
        if missing or extra:
            raise fail(
                Code.INDEX_INVALID,
                f"{INDEX_NAME}: {where}: missing fields {missing} / unknown fields {extra}",
            )
        return value

    @staticmethod
    def _int(value: Any, where: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_INT:
            raise fail(Code.INDEX_INVALID, f"{INDEX_NAME}: {where} is not an integer in "
                       "0..2^63 - 1")  # fmt: skip
        return value

    @staticmethod
    def _str(value: Any, where: str, pattern: re.Pattern[str] | None = None) -> str:
        if not isinstance(value, str) or (pattern and not pattern.fullmatch(value)):
            raise fail(Code.INDEX_INVALID, f"{INDEX_NAME}: {where} is malformed: {value!r}")
        try:  # inspect prints these before any signature check: no terminal control
            check_text(value, f"{INDEX_NAME}: {where}")
        except WeightsError as exc:
            raise fail(Code.INDEX_INVALID, str(exc)) from None
        return value

    def index(self) -> Index:
        top_keys = (
            "format", "format_version", "tool", "created_at", "compression", "part_size",
            "payload_size", "lock", "files", "blobs", "parts",
        )  # fmt: skip
        if not isinstance(self.doc, dict):
            raise fail(Code.INDEX_INVALID, f"{INDEX_NAME} is not a JSON object")
        if self.doc.get("format") != FORMAT or self.doc.get("format_version") != FORMAT_VERSION:
            raise fail(
                Code.UNSUPPORTED_FORMAT,
                f"{INDEX_NAME}: format {self.doc.get('format')!r} version "
                f"{self.doc.get('format_version')!r} is not {FORMAT!r} version {FORMAT_VERSION}",
            )
        base_raw = self.doc.get("base") if isinstance(self.doc, dict) else None
        doc = self._obj(self.doc, "$", top_keys + (("base",) if "base" in self.doc else ()))
        if doc["compression"] not in COMPRESSIONS:
            raise fail(Code.UNSUPPORTED_FORMAT, f"compression {doc['compression']!r} unsupported")
        part_size = self._int(doc["part_size"], "$.part_size")
        payload_size = self._int(doc["payload_size"], "$.payload_size")
        if part_size < 1:
            raise fail(Code.INDEX_INVALID, f"{INDEX_NAME}: $.part_size must be positive")
        lock = self._lock(doc["lock"])
        parts = self._parts(doc["parts"], part_size, payload_size)
        blobs = self._blobs(doc["blobs"], payload_size, doc["compression"])
        base = self._base(base_raw) if "base" in doc else None
        files = self._files(doc["files"], lock, {b.sha256: b for b in blobs}, base)
        return Index(
            tool=self._str(doc["tool"], "$.tool"),
            created_at=self._str(doc["created_at"], "$.created_at"),
            compression=doc["compression"],
            part_size=part_size,
            payload_size=payload_size,
            lock=lock,
            files=files,
            blobs=blobs,
            parts=parts,
            base=base,
        )

    def _base(self, raw: Any) -> Base:
        b = self._obj(raw, "$.base", ("index_sha256", "blobs"))
        if not isinstance(b["blobs"], list) or not b["blobs"]:
            raise fail(Code.INDEX_INVALID, f"{INDEX_NAME}: $.base.blobs is not a non-empty array")
        blobs: dict[str, BaseBlob] = {}
        for i, item in enumerate(b["blobs"]):
            where = f"$.base.blobs[{i}]"
            e = self._obj(item, where, ("sha256", "size"))
            bb = BaseBlob(self._str(e["sha256"], f"{where}.sha256", _HEX64),
                          self._int(e["size"], f"{where}.size"))
            if bb.sha256 in blobs:
                raise fail(Code.BLOBS_LAYOUT, f"base blob {bb.sha256[:12]} listed twice")
            blobs[bb.sha256] = bb
        return Base(self._str(b["index_sha256"], "$.base.index_sha256", _HEX64),
                    tuple(blobs.values()))

    def _lock(self, raw: Any) -> Lockfile:
        # Path and ref checks first, so hostile names get their precise code.
        models = raw.get("models") if isinstance(raw, dict) else None
        for m in models if isinstance(models, list) else []:
            if not isinstance(m, dict):
                continue
            rev = m.get("requested_revision")
            if isinstance(rev, str) and not is_commit_sha(rev):
                paths.check_ref_name(rev)
            for f in m.get("files") or []:
                if isinstance(f, dict):
                    paths.check_path(f.get("path"), what=f"lockfile path of {m.get('repo_id')}")
        try:
            lock = Lockfile.loads(json.dumps(raw), source=f"{INDEX_NAME} $.lock")
        except PathCollisionError as exc:  # the lockfile's install-path rule, both named
            raise fail(Code.PATH_COLLISION, exc.message, path=exc.second) from None
        except EmptyModelError as exc:
            raise fail(Code.EMPTY_MODEL, exc.message) from None
        except LockfileError as exc:
            raise fail(Code.INDEX_INVALID, str(exc)) from None
        if not lock.entries:
            raise fail(Code.EMPTY_MODEL, "the bundle carries no model")
        for entry in lock.entries:  # stricter than the lockfile: portable to any file system
            paths.check_tree((f.path for f in entry.files), where=entry.repo_id)
        return lock

    def _parts(self, raw: Any, part_size: int, payload_size: int) -> tuple[Part, ...]:
        if not isinstance(raw, list):
            raise fail(Code.INDEX_INVALID, f"{INDEX_NAME}: $.parts is not an array")
        if len(raw) > MAX_PARTS:  # as pack refuses to write them: never stat 300,000 files
            raise fail(Code.INDEX_INVALID, f"{INDEX_NAME}: $.parts lists {len(raw)} parts, "
                       f"at most {MAX_PARTS} are allowed")  # fmt: skip
        parts: list[Part] = []
        for i, item in enumerate(raw):
            where = f"$.parts[{i}]"
            p = self._obj(item, where, ("name", "offset", "size", "sha256"))
            name = paths.check_path(p["name"], what="part name")
            if name != paths.part_name(i, len(raw)):
                raise fail(
                    Code.INDEX_INVALID,
                    f"{INDEX_NAME}: {where}: part name {name!r} is not "
                    f"{paths.part_name(i, len(raw))!r}",
                    part=name,
                )
            part = Part(
                name,
                self._int(p["offset"], f"{where}.offset"),
                self._int(p["size"], f"{where}.size"),
                self._str(p["sha256"], f"{where}.sha256", _HEX64),
            )
            if not 0 < part.size <= part_size:
                raise fail(
                    Code.INDEX_INVALID,
                    f"{INDEX_NAME}: part {name} size {part.size} not in 1..{part_size}",
                    part=name,
                )
            expected = parts[-1].offset + parts[-1].size if parts else 0
            if part.offset < expected:
                raise fail(
                    Code.PARTS_OVERLAP,
                    f"part {name} starts at {part.offset}, inside the previous part "
                    f"(which ends at {expected})",
                    part=name, expected=str(expected), actual=str(part.offset),
                )  # fmt: skip
            if part.offset > expected:
                raise fail(
                    Code.PARTS_GAP,
                    f"part {name} starts at {part.offset}, leaving a gap after byte {expected}",
                    part=name, expected=str(expected), actual=str(part.offset),
                )  # fmt: skip
            parts.append(part)
        end = parts[-1].offset + parts[-1].size if parts else 0
        if end != payload_size:
            code = Code.PARTS_OVERLAP if end > payload_size else Code.PARTS_GAP
            raise fail(code, f"parts cover {end} bytes but the payload has {payload_size}")
        return tuple(parts)

    def _blobs(self, raw: Any, payload_size: int, compression: str) -> tuple[Blob, ...]:
        if not isinstance(raw, list):
            raise fail(Code.INDEX_INVALID, f"{INDEX_NAME}: $.blobs is not an array")
        blobs: list[Blob] = []
        seen: set[str] = set()
        offset = 0
        for i, item in enumerate(raw):
            where = f"$.blobs[{i}]"
            b = self._obj(item, where, ("sha256", "size", "offset", "stored_size", "encoding"))
            blob = Blob(
                self._str(b["sha256"], f"{where}.sha256", _HEX64),
                self._int(b["size"], f"{where}.size"),
                self._int(b["offset"], f"{where}.offset"),
                self._int(b["stored_size"], f"{where}.stored_size"),
                b["encoding"],
            )
            if blob.encoding not in ENCODINGS or (
                blob.encoding != "identity" and compression == "none"
            ):
                raise fail(Code.UNSUPPORTED_FORMAT, f"{where}: encoding {blob.encoding!r} "
                           f"unsupported with compression {compression!r}")  # fmt: skip
            if blob.encoding == "identity" and blob.stored_size != blob.size:
                raise fail(Code.BLOBS_LAYOUT, f"{where}: stored_size differs from size")
            if blob.offset != offset:
                raise fail(
                    Code.BLOBS_LAYOUT,
                    f"blob {blob.sha256[:12]} at offset {blob.offset}, expected {offset}",
                )
            if blob.sha256 in seen:
                raise fail(Code.BLOBS_LAYOUT, f"blob {blob.sha256[:12]} is stored twice")
            seen.add(blob.sha256)
            blobs.append(blob)
            offset += blob.stored_size
        if offset != payload_size:
            raise fail(Code.BLOBS_LAYOUT, f"blobs cover {offset} bytes of {payload_size}")
        return tuple(blobs)

    def _files(
        self, raw: Any, lock: Lockfile, blobs: dict[str, Blob], base: Base | None = None
    ) -> tuple[ContentFile, ...]:
        if not isinstance(raw, list):
            raise fail(Code.INDEX_INVALID, f"{INDEX_NAME}: $.files is not an array")
        files: list[ContentFile] = []
        for i, item in enumerate(raw):
            where = f"$.files[{i}]"
            f = self._obj(item, where, ("repo_id", "path", "size", "sha256", "blob_id"))
            repo_id = f["repo_id"]
            if repo_id is not None and not isinstance(repo_id, str):
                raise fail(Code.INDEX_INVALID, f"{INDEX_NAME}: {where}.repo_id is malformed")
            cf = ContentFile(
                repo_id,
                paths.check_path(f["path"], what=f"file path in {INDEX_NAME}"),
                self._int(f["size"], f"{where}.size"),
                self._str(f["sha256"], f"{where}.sha256", _HEX64),
                self._str(f["blob_id"], f"{where}.blob_id", _BLOB_ID),
            )
            blob: Blob | BaseBlob | None = blobs.get(cf.sha256)
            if blob is None and base is not None and cf.repo_id is not None:
                blob = next((b for b in base.blobs if b.sha256 == cf.sha256), None)
            if blob is None or blob.size != cf.size:
                raise fail(
                    Code.BLOBS_LAYOUT, f"{cf.label}: no stored blob of its sha256 and size",
                    path=cf.label,
                )  # fmt: skip
            files.append(cf)
        _check_against_lock(files, lock)
        paths.check_tree((f.path for f in files if f.repo_id is None), where="extras")
        used = {f.sha256 for f in files}
        unused = [s for s in blobs if s not in used]
        unused += [b.sha256 for b in (base.blobs if base else ()) if b.sha256 not in used]
        both = [b.sha256 for b in (base.blobs if base else ()) if b.sha256 in blobs]
        if both:
            raise fail(Code.BLOBS_LAYOUT, f"blob {both[0][:12]} is both stored and a base blob")
        if unused:
            raise fail(Code.BLOBS_LAYOUT, f"blob {unused[0][:12]} is stored but used by no file")
        return tuple(files)


def _check_against_lock(files: list[ContentFile], lock: Lockfile) -> None:
    """Every model file must be exactly one pinned file, and every pinned file present."""
    by_key: dict[tuple[str, str], ContentFile] = {}
    for f in files:
        if f.repo_id is None:
            continue
        if (f.repo_id, f.path) in by_key:
            raise fail(Code.PATH_COLLISION, f"{f.label} is listed twice", path=f.label)
        by_key[(f.repo_id, f.path)] = f
    pinned_keys: set[tuple[str, str]] = set()
    for entry in lock.entries:
        for pin in entry.files:
            key = (entry.repo_id, pin.path)
            pinned_keys.add(key)
            got = by_key.get(key)
            label = f"{entry.repo_id}:{pin.path}"
            if got is None:
                raise fail(Code.PIN_MISMATCH, f"{label} is pinned but not carried", path=label)
            for name, want, have in (
                ("size", str(pin.size), str(got.size)),
                ("sha256", pin.sha256, got.sha256),
                ("blob_id", pin.blob_id, got.blob_id),
            ):
                if want != have:
                    raise fail(
                        Code.PIN_MISMATCH, f"{label}: {name} differs from the lockfile pin",
                        path=label, expected=want, actual=have,
                    )  # fmt: skip
    for key, f in by_key.items():
        if key not in pinned_keys:
            raise fail(Code.PIN_MISMATCH, f"{f.label} is carried but not pinned", path=f.label)


def check_expected_lock(index: Index, expected: Lockfile) -> list[VerificationFailed]:
    """Compare the carried pins with a lockfile the operator trusts (``--lock``).

    Returns:
        one ``pin_mismatch`` failure per expected model that is missing or pinned differently.
    """
    out: list[VerificationFailed] = []
    for want in expected.entries:
        have = index.lock.get(want.repo_id)
        if have is None:
            out.append(fail(Code.PIN_MISMATCH, f"{want.repo_id} is not in the bundle"))
        elif have.commit != want.commit or have.files != want.files:
            out.append(
                fail(
                    Code.PIN_MISMATCH,
                    f"{want.repo_id}: bundle pins commit {have.commit} / files differing from "
                    f"the expected lockfile (commit {want.commit})",
                    path=want.repo_id,
                    expected=want.commit,
                    actual=have.commit,
                )
            )
    return out
