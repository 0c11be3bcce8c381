"""Serialisation policy: which weight formats may be staged, found by name and by content.

Default policy (``SerialisationPolicy()``): safetensors, GGUF and plain data files only.
A pickle-based file executes code when loaded (``torch.load``, ``pickle.load``), so it is
refused at pin, lock, pull, pack and unpack with one line naming the file and the switch
``--allow-pickle``. With the switch the file is scanned by :mod:`weights.pickle_scan` (an
allowlist over ``pickletools.genops``; nothing is unpickled) and refused if unsafe; the verdict
(scanner name and version, imported callables) is recorded in the lockfile and bundle index.

A file is pickle-based if any of these holds (name alone is not enough: a renamed pickle is
the first evasion tried, and a header alone is not enough: a polyglot is the second):

* its content starts with a pickle a loader would act on (:func:`weights.pickle_scan.is_pickle`),
  whatever header it also carries: this is decided before any other format;
* its name ends in ``.bin``, ``.pt``, ``.pth``, ``.ckpt``, ``.pkl``, ``.pickle``, ``.joblib``
  and its content is not safetensors or GGUF by a full parse
  (:mod:`weights.safetensors_format`, :mod:`weights.gguf_format`);
* it is a NumPy ``.npy`` array of objects (:mod:`weights.npy_format`: its data is a pickle);
* it is a zip archive (``torch.save``'s format since torch 1.6, ``.npz``) holding a pickle, an
  array of objects or another archive (nested archives are scanned member by member, at most
  3 deep; deeper, or an encrypted member, is refused with its own code).

A file that only looks like safetensors or GGUF (its name or first bytes) but does not parse
is ``data``: the ML-BOM and lock never call it a format no loader would accept.

Sources: safetensors header layout (8-byte little-endian header length, then a JSON object;
huggingface/safetensors README); GGUF magic ``GGUF`` (ggml docs/gguf.md); zip local header
``PK\\x03\\x04`` (PKWARE APPNOTE 4.3.7).
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from weights.errors import WeightsError
from weights.gguf_format import MalformedGGUF, parse_gguf
from weights.npy_format import MAGIC as NPY_MAGIC
from weights.npy_format import read_npy_header
from weights.pickle_scan import (
    SCANNER_NAME,
    SCANNER_VERSION,
    NotAPickle,
    PickleVerdict,
    is_pickle,
    scan_pickle_stream,
)
from weights.safetensors_format import (
    MalformedSafetensors,
    looks_like_safetensors,
    parse_safetensors,
)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle", ".joblib")
#: Nesting depth of archives inside archives that is still scanned; deeper is refused.
MAX_ARCHIVE_DEPTH = 3
#: Largest archive member read into memory for scanning, in bytes (pickles inside torch
#: archives are small: tensor data lives in separate members).
MAX_MEMBER_BYTES = 256 * 1024**2

ALLOW_SWITCH = "--allow-pickle"
SCANNER = f"{SCANNER_NAME} {SCANNER_VERSION}"


class UnsafeSerialisationError(WeightsError):
    """A file is pickle-based and the policy refuses it (or the scanner found it unsafe).

    Attributes:
        path: The file (repository-relative or as given).
    """

    code = "unsafe_serialisation"

    def __init__(self, message: str, *, path: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path


class ModelFileRefused(UnsafeSerialisationError):
    """A model file that cannot be inspected, with its own code: ``encrypted_archive``,
    ``archive_too_deep``."""

    def __init__(self, message: str, *, path: str, code: str, hint: str | None = None) -> None:
        super().__init__(message, path=path, hint=hint)
        self.code = code


@dataclass(frozen=True)
class SerialisationPolicy:
    """What may be staged.

    Attributes:
        allow_pickle: Accept pickle-based files that the allowlist scanner finds safe.
        allow_remote_code: Accept Python files and configs with ``auto_map`` (what
            ``trust_remote_code=True`` runs at load); refused by default.
    """

    allow_pickle: bool = False
    allow_remote_code: bool = False


#: The default policy: safetensors, GGUF and data files; every pickle refused.
DEFAULT_POLICY = SerialisationPolicy()


@dataclass(frozen=True)
class FormatVerdict:
    """The format of one file and, for pickles, the scan.

    Attributes:
        format: ``safetensors``, ``gguf``, ``pickle`` or ``data`` (anything else: JSON,
            text, tokenizers, ONNX ...; nothing in it is executed by a loader).
        scan: ``"<scanner> <version>: safe (globals ...)"`` for a scanned pickle, else None.
        pickle: The scanner's verdict for a pickle (None otherwise or when not scanned).
    """

    format: str
    scan: str | None = None
    pickle: PickleVerdict | None = None


REMOTE_CODE_SWITCH = "--allow-remote-code"
#: The largest JSON file read to look for ``auto_map``, in bytes (configs are a few KiB).
MAX_CONFIG_BYTES = 16 * 1024**2


def remote_code_reason(path: Path, label: str) -> str | None:
    """Why ``path`` is code a loader runs with ``trust_remote_code``, or None.

    A ``.py`` file is code (``modeling_*.py``, ``configuration_*.py`` ... are imported by
    transformers' dynamic module loader); a JSON file whose top-level object has ``auto_map``
    (config.json, tokenizer_config.json) names such code for ``AutoModel``/``AutoTokenizer``
    (transformers ``dynamic_module_utils``).
    """
    lower = label.lower()
    if lower.endswith(".py"):
        return "a Python file (run by trust_remote_code)"
    if not lower.endswith(".json"):
        return None
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    if isinstance(doc, dict) and "auto_map" in doc:
        return "a config with auto_map (asks for trust_remote_code)"
    return None


class RemoteCodeRefused(UnsafeSerialisationError):
    """A file that ``trust_remote_code`` would run, refused without ``allow_remote_code``."""

    code = "remote_code"


def named_as_pickle(path: str) -> bool:
    """True if the file name has a pickle-based extension (case-insensitive)."""
    return path.lower().endswith(PICKLE_SUFFIXES)


def sniff(fh: BinaryIO, size: int) -> str:
    """Return the format of a file by content: ``pickle``, ``safetensors``, ``gguf``, ``npy``,
    ``zip`` or ``data``. ``fh`` is positioned at 0 and left there.

    Anything a pickle loader would execute is a ``pickle`` first, whatever header it also
    carries (``G\\0\\0\\0\\0\\0\\0\\0{`` reads as a safetensors length and, to the
    unpickler, as a float followed by a payload; ``GGUF`` + 5 bytes likewise). Safetensors and
    GGUF are then decided by a full parse (:func:`parse_safetensors`, :func:`parse_gguf`): a
    header that only looks right is ``data``.
    """
    try:
        if is_pickle(fh, size):
            return "pickle"
        head = fh.read(16)
        fh.seek(0)
        if head[:4] == b"GGUF":
            return "gguf" if _parses(parse_gguf, fh, size) else "data"
        if looks_like_safetensors(head, size):
            return "safetensors" if _parses(parse_safetensors, fh, size) else "data"
        if head[:6] == NPY_MAGIC:
            return "npy"
        if head[:4] == b"PK\x03\x04":
            return "zip"
        return "data"
    finally:
        fh.seek(0)


def _parses(parse: Callable[[BinaryIO, int], object], fh: BinaryIO, size: int) -> bool:
    try:
        parse(fh, size)
    except (MalformedSafetensors, MalformedGGUF):
        return False
    finally:
        fh.seek(0)
    return True


def _npy_pickle(fh: BinaryIO, size: int, label: str) -> PickleVerdict | None:
    """The pickle inside an ``.npy`` of objects (None for a plain numeric array)."""
    header = read_npy_header(fh)
    if header is None or not header.holds_objects:
        return None
    fh.seek(header.data_offset)
    try:
        return scan_pickle_stream(fh, max(0, size - header.data_offset))
    except NotAPickle:
        return _pickle_verdict([], [f"{label}: NumPy array of objects whose data is not a "
                                    "pickle"], 0)
    finally:
        fh.seek(0)


def _scan_zip(data: BinaryIO, label: str, depth: int) -> tuple[bool, list[str], list[str]]:
    """Scan an archive: (holds pickles, globals, findings).

    Raises:
        ModelFileRefused: ``archive_too_deep`` (archives nested deeper than
            :data:`MAX_ARCHIVE_DEPTH`), ``encrypted_archive`` (a member needs a password: its
            content cannot be inspected).
    """
    if depth > MAX_ARCHIVE_DEPTH:
        raise ModelFileRefused(
            f"{label}: archives nested deeper than {MAX_ARCHIVE_DEPTH} cannot be inspected",
            path=label, code="archive_too_deep", hint="unpack the inner archive first")
    try:
        zf = zipfile.ZipFile(data)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        return True, [], [f"{label}: unreadable zip archive ({exc})"]
    has_pickle = False
    found: list[str] = []
    findings: list[str] = []
    with zf:
        for info in zf.infolist():
            where = f"{label}!{info.filename}"
            if info.is_dir():
                continue
            if info.flag_bits & 0x1:
                raise ModelFileRefused(
                    f"{where}: encrypted archive member cannot be inspected",
                    path=label, code="encrypted_archive",
                    hint="ship the member unencrypted (loaders cannot read it either)")
            if info.file_size > MAX_MEMBER_BYTES and not info.filename.endswith(".pkl"):
                continue  # tensor storage: the loader never unpickles it
            if info.file_size > MAX_MEMBER_BYTES:
                return True, found, [*findings, f"{where}: pickle larger than the scan limit"]
            try:
                member = zf.read(info)
            except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError,
                    RuntimeError) as exc:
                return True, found, [*findings, f"{where}: unreadable member ({exc})"]
            buf = io.BytesIO(member)
            kind = sniff(buf, len(member))
            if kind == "zip":
                nested, g, f = _scan_zip(buf, where, depth + 1)
                has_pickle |= nested
                found += g
                findings += f
            elif kind == "npy":
                verdict = _npy_pickle(buf, len(member), where)
                if verdict is not None:
                    has_pickle = True
                    found += verdict.globals
                    findings += [f"{where}: {x}" for x in verdict.findings]
            elif kind == "pickle" or info.filename.endswith(".pkl"):
                has_pickle = True
                try:
                    v = scan_pickle_stream(buf, len(member))
                except NotAPickle as exc:
                    findings.append(f"{where}: named .pkl but not a pickle ({exc})")
                    continue
                found += v.globals
                findings += [f"{where}: {x}" for x in v.findings]
    return has_pickle, found, findings


def _pickle_verdict(found: Iterable[str], findings: list[str], pickles: int) -> PickleVerdict:
    return PickleVerdict(safe=not findings, globals=tuple(sorted(set(found))),
                         findings=tuple(findings), pickles=pickles)


def inspect_file(path: Path, label: str) -> tuple[str, PickleVerdict | None]:
    """Find the format of ``path`` and scan it if it is pickle-based (never unpickles).

    Returns:
        (format, verdict): verdict is None unless format is ``pickle``. Formats:
        ``safetensors``, ``gguf`` (each only after a full parse), ``pickle`` (by content,
        by name, a NumPy array of objects, or an archive holding one), ``data``.

    Raises:
        ModelFileRefused: An encrypted archive member (``encrypted_archive``), archives
            nested too deep (``archive_too_deep``).
        OSError: The file cannot be read.
    """
    with path.open("rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        kind = sniff(fh, size)
        if kind in ("safetensors", "gguf"):
            return kind, None
        if kind == "npy":
            npy = _npy_pickle(fh, size, label)
            if npy is not None:
                return "pickle", npy
            return ("pickle", _pickle_verdict([], [f"{label}: named as a pickle but a "
                                                   "NumPy array"], 0)) \
                if named_as_pickle(label) else ("data", None)
        if kind == "zip":
            has_pickle, found, findings = _scan_zip(fh, label, 1)
            if has_pickle or named_as_pickle(label):
                if not has_pickle:
                    findings.append(f"{label}: pickle-named archive without a pickle")
                return "pickle", _pickle_verdict(found, findings, 0)
            return "data", None
        if kind == "pickle":
            return "pickle", scan_pickle_stream(fh, size)
        if named_as_pickle(label):
            return "pickle", _pickle_verdict(
                [], [f"{label}: named as a pickle but neither a pickle nor safetensors/GGUF"], 0)
        return "data", None


def describe(verdict: PickleVerdict) -> str:
    """The one-line verdict recorded in lockfiles and indexes."""
    state = "safe" if verdict.safe else "unsafe"
    return f"{SCANNER}: {state} (globals: {', '.join(verdict.globals) or 'none'})"


def check_format(path: Path, label: str, policy: SerialisationPolicy) -> FormatVerdict:
    """Apply ``policy`` to one file.

    Args:
        path: The file on disk.
        label: How to name it in messages (``repo_id:path``).
        policy: The policy.

    Returns:
        The format and, for an allowed pickle, the recorded scan line.

    Raises:
        RemoteCodeRefused: Code ``trust_remote_code`` would run (``remote_code_reason``)
            without ``allow_remote_code``; with it, the format is ``code``.
        UnsafeSerialisationError: A pickle-based file without ``allow_pickle``, or one the
            scanner finds unsafe (message names the file and the first findings).
        OSError: The file cannot be read.
    """
    code = remote_code_reason(path, label)
    if code is not None:
        if not policy.allow_remote_code:
            raise RemoteCodeRefused(
                f"{label}: {code} refused; re-run with {REMOTE_CODE_SWITCH} to stage it (the "
                "server must then be started with trust_remote_code)", path=label)
        return FormatVerdict("code", f"remote code accepted with {REMOTE_CODE_SWITCH}")
    kind, verdict = inspect_file(path, label)
    if kind != "pickle":
        return FormatVerdict(kind)
    assert verdict is not None
    if not policy.allow_pickle:
        raise refuse_by_name(label)
    if not verdict.safe:
        raise UnsafeSerialisationError(
            f"{label}: pickle refused by {SCANNER}: {'; '.join(verdict.findings[:3])}",
            path=label,
            hint="convert it to safetensors; the scanner accepts only a plain tensor state dict",
        )
    return FormatVerdict("pickle", describe(verdict), verdict)


def refuse_by_name(label: str) -> UnsafeSerialisationError:
    """The refusal of a pickle-based file under the default policy (one line, names the switch)."""
    return UnsafeSerialisationError(
        f"{label}: pickle-based file refused (it can run code when loaded); "
        f"re-run with {ALLOW_SWITCH} to scan and accept a plain tensor state dict",
        path=label,
    )


def check_names(labels: Iterable[str], policy: SerialisationPolicy) -> None:
    """Refuse pickle-named files under the default policy, before any byte is fetched.

    Raises:
        UnsafeSerialisationError: The first pickle-named file (when not ``allow_pickle``).
    """
    if policy.allow_pickle:
        return
    for label in labels:
        if named_as_pickle(label):
            raise refuse_by_name(label)


__all__ = [
    "ALLOW_SWITCH",
    "DEFAULT_POLICY",
    "PICKLE_SUFFIXES",
    "REMOTE_CODE_SWITCH",
    "SCANNER",
    "FormatVerdict",
    "ModelFileRefused",
    "RemoteCodeRefused",
    "SerialisationPolicy",
    "UnsafeSerialisationError",
    "check_format",
    "check_names",
    "describe",
    "inspect_file",
    "named_as_pickle",
    "remote_code_reason",
    "sniff",
]
