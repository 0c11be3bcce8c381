"""Errors of the air-gap package, each with a stable machine ``code``.

Exception tree::

    AirgapError                 usage or I/O problem (CLI exit 2)
    ├── StoreError              the target store cannot be written safely (exit 2)
    └── VerificationFailed      the bundle, its signature or its content is not trusted (exit 1)
                                carries every ``Problem`` found, not just the first

``Code`` lists every stable code; tests and operators' scripts match on these strings, so a code
is never renamed, only added.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Code(StrEnum):
    """Stable error codes (documented in docs/airgap.md)."""

    # usage and I/O (exit 2)
    IO_ERROR = "io_error"
    BUNDLE_NOT_FOUND = "bundle_not_found"
    OUTPUT_EXISTS = "output_exists"
    KEY_INVALID = "key_invalid"
    SOURCE_MISSING = "source_missing"
    LOCK_INVALID = "lock_invalid"
    # signature (exit 1)
    SIGNATURE_MISSING = "signature_missing"
    SIGNATURE_MALFORMED = "signature_malformed"
    SIGNATURE_UNTRUSTED_KEY = "signature_untrusted_key"
    SIGNATURE_INVALID = "signature_invalid"
    # index structure (exit 1)
    INDEX_MISSING = "index_missing"
    INDEX_INVALID = "index_invalid"
    UNSUPPORTED_FORMAT = "unsupported_format"
    UNSAFE_PATH = "unsafe_path"
    PATH_COLLISION = "path_collision"
    PARTS_OVERLAP = "parts_overlap"
    PARTS_GAP = "parts_gap"
    BLOBS_LAYOUT = "blobs_layout"
    EMPTY_MODEL = "empty_model"
    PIN_MISMATCH = "pin_mismatch"
    UNSAFE_SERIALISATION = "unsafe_serialisation"
    DELTA_BASE_MISSING = "delta_base_missing"
    MLBOM_MISMATCH = "mlbom_mismatch"
    OCI_INVALID = "oci_invalid"
    OCI_DIGEST_MISMATCH = "oci_digest_mismatch"
    # parts on the media (exit 1)
    PART_MISSING = "part_missing"
    PART_EXTRA = "part_extra"
    PART_SYMLINK = "part_symlink"
    PART_HARDLINK = "part_hardlink"
    PART_NOT_REGULAR = "part_not_regular"
    PART_SIZE_MISMATCH = "part_size_mismatch"
    PART_DIGEST_MISMATCH = "part_digest_mismatch"
    CONTENT_DIGEST_MISMATCH = "content_digest_mismatch"
    CONTENT_UNREADABLE = "content_unreadable"
    # store (exit 2)
    STORE_UNSAFE = "store_unsafe"
    STORE_CONFLICT = "store_conflict"


@dataclass(frozen=True)
class Problem:
    """One finding of a verification.

    Attributes:
        code: stable ``Code`` value.
        message: one human sentence: what is wrong and where.
        part: payload part file name, when the problem is in one part.
        path: content file path (``repo_id:path`` for model files), when it concerns a file.
        expected: expected value (digest hex or size in bytes as text), if any.
        actual: value found, if any.
    """

    code: str
    message: str
    part: str | None = None
    path: str | None = None
    expected: str | None = None
    actual: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the problem as a JSON-ready dict (``None`` fields dropped)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


class AirgapError(Exception):
    """Base of every air-gap error: a usage or I/O problem unless a subclass says otherwise.

    Args:
        code: stable ``Code`` value.
        message: what happened, where, and what to do.
    """

    exit_code = 2

    def __init__(self, code: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.code = str(code)
        self.message = message
        #: What to do next, shown by the CLI after the message (None: the message says it).
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} [{self.code}]"


class StoreError(AirgapError):
    """The target store cannot be changed safely (unsafe layout or conflicting content).

    Args:
        code: stable ``Code`` value.
        message: what happened, where, and what to do.
        hint: what to do next.
        paths: for ``store_conflict`` on a model directory, every entry in the way (relative
            to that directory), not only those the message names.
    """

    def __init__(self, code: str, message: str, *, hint: str | None = None,
                 paths: tuple[str, ...] = ()) -> None:
        super().__init__(code, message, hint=hint)
        self.paths = paths


class VerificationFailed(AirgapError):
    """The bundle is not trustworthy; ``problems`` lists every finding.

    The exception's ``code`` is the code of the first problem.
    """

    exit_code = 1

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        if not self.problems:
            raise ValueError("VerificationFailed needs at least one problem")
        first = self.problems[0]
        more = len(self.problems) - 1
        message = first.message + (f" (and {more} more problem(s))" if more else "")
        super().__init__(first.code, message)

    @property
    def codes(self) -> set[str]:
        """The set of problem codes."""
        return {p.code for p in self.problems}


def fail(code: Code, message: str, **fields: str | None) -> VerificationFailed:
    """Build a ``VerificationFailed`` with one problem (for ``raise fail(...)``)."""
    return VerificationFailed([Problem(str(code), message, **fields)])
