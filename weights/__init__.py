"""Weight staging: pin Hugging Face models to commits, pull and verify exact bytes, sign, size.

Public API (other packages import only these names)::

    Lockfile, LockEntry, LockedFile          weights.lock model (load/dumps/save/entry)
    check_text                               refuse terminal control characters in lock text
    verify_tree -> VerifyReport, Mismatch    offline verification of a directory or HF cache
    sha256_file, git_blob_sha1, digest_file  digests as the Hub defines them
    hf_cache_paths, install_hf_cache         the Hugging Face cache layout
    existing_twin                            a store folder a new one would merge with (case, NFC)
    WeightsError (+ subclasses, each with a stable ``code``)
    SerialisationPolicy, check_format        refuse pickle-based files (weights.serialisation)

Nothing here touches the network; only :mod:`weights.hub` (imported lazily by ``pin``/``pull``)
talks to the configured hub endpoint.
"""

from weights.cache import (
    HfCachePaths,
    hf_cache_paths,
    install_hf_cache,
    repo_folder_name,
    resolve_model_dir,
    write_ref,
)
from weights.digests import FileDigests, digest_file, git_blob_sha1, sha256_file
from weights.errors import (
    CacheLayoutError,
    DigestMismatchError,
    EmptyModelError,
    EntryNotInLockError,
    LockfileError,
    PathCollisionError,
    UnsafeSerialisationError,
    WeightsError,
)
from weights.format_scan import named_as_pickle
from weights.installpaths import existing_twin
from weights.lockfile import (
    LockedFile,
    LockEntry,
    Lockfile,
    check_repo_path,
    is_commit_sha,
)
from weights.lockvalues import check_text
from weights.modeltree import UnsafeTreeError, check_model_file, model_files, unsafe_path_reason
from weights.serialisation import (
    ALLOW_SWITCH,
    DEFAULT_POLICY,
    REMOTE_CODE_SWITCH,
    SCANNER,
    SerialisationPolicy,
    check_format,
)
from weights.verify import Mismatch, VerifyReport, verify_tree

__all__ = [
    "ALLOW_SWITCH",
    "DEFAULT_POLICY",
    "REMOTE_CODE_SWITCH",
    "SCANNER",
    "CacheLayoutError",
    "DigestMismatchError",
    "EmptyModelError",
    "EntryNotInLockError",
    "FileDigests",
    "HfCachePaths",
    "LockEntry",
    "LockedFile",
    "Lockfile",
    "LockfileError",
    "Mismatch",
    "PathCollisionError",
    "SerialisationPolicy",
    "UnsafeSerialisationError",
    "UnsafeTreeError",
    "VerifyReport",
    "WeightsError",
    "check_format",
    "check_model_file",
    "check_repo_path",
    "check_text",
    "digest_file",
    "existing_twin",
    "git_blob_sha1",
    "hf_cache_paths",
    "install_hf_cache",
    "is_commit_sha",
    "model_files",
    "named_as_pickle",
    "repo_folder_name",
    "resolve_model_dir",
    "sha256_file",
    "unsafe_path_reason",
    "verify_tree",
    "write_ref",
]
