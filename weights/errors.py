"""Errors raised by the ``weights`` package.

Every error derives from :class:`WeightsError` and carries a stable machine ``code``::

    WeightsError                      code "weights_error"
    +-- LockfileError                 "lockfile_invalid"     bad or unreadable weights.lock
    |   +-- PathCollisionError        "path_collision"       two pinned files, one install path
    |   +-- EmptyModelError           "empty_model"          a pinned model with no files
    +-- EntryNotInLockError           "lock_entry_missing"   repo id not pinned in the lock
    +-- DigestMismatchError           "digest_mismatch"      bytes differ from the pinned digest
    +-- HubError                      "hub_error"            hub unreachable or protocol error
    |   +-- RepoNotFoundError         "repo_not_found"
    |   +-- RevisionNotFoundError     "revision_not_found"
    |   +-- FileNotOnHubError         "entry_not_found"
    |   +-- GatedRepoError            "gated_repo"           needs a token with access
    |   +-- RedirectRefusedError      "redirect_refused"     hub redirected off the allowed hosts
    |   +-- HubOfflineError           "hub_offline"          offline mode (HF_HUB_OFFLINE) is on
    |   +-- HubAnswerError            "hub_answer_invalid"   a malformed value in the answer
    |       +-- HubMismatchError      "hub_mismatch"         answer for another repo or commit
    |       +-- UnsafeHubPathError    "unsafe_hub_path"      a file path that escapes the model
    +-- LicenseRefusedError           "license_refused"      --allow-license rejected the model
    +-- DriftError                    "revision_drift"       a branch moved since it was pinned
    +-- CacheLayoutError              "cache_layout"         unusable Hugging Face cache tree
    +-- StorageError                  "io_error"             a local file cannot be written
    +-- SigningError                  "signing_error"        key or signature file unusable
    +-- SignatureVerificationError    "signature_invalid"    signature does not verify
    +-- SizingError                   "sizing_error"         config/safetensors unreadable
    +-- TargetNotFoundError           "target_not_found"     a model path that does not exist
    +-- OutputExistsError             "output_exists"        a file to write exists (no --force)
    +-- UnsafeSerialisationError      "unsafe_serialisation" a pickle the policy refuses
        +-- ModelFileRefused          "encrypted_archive", "archive_too_deep" (not inspectable)
        +-- RemoteCodeRefused         "remote_code"          code trust_remote_code would run

The CLI maps verification failures (digest, signature) to exit 1 and everything else to 2.
"""

from __future__ import annotations


class WeightsError(Exception):
    """Base of every error raised by :mod:`weights`.

    Attributes:
        code: Stable machine-readable error code (see the module docstring).
        hint: Optional one-line advice on what to do next, shown by the CLI.
    """

    code: str = "weights_error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class LockfileError(WeightsError):
    """The lockfile is unreadable, not JSON, or a field is invalid (message names the field)."""

    code = "lockfile_invalid"


class PathCollisionError(LockfileError):
    """Two pinned files (of one model or two) would install to the same path in a layout.

    Attributes:
        first: ``repo_id:path`` (or repo id) of one of them.
        second: the other.
    """

    code = "path_collision"

    def __init__(self, message: str, *, first: str, second: str) -> None:
        super().__init__(message, hint="a lockfile must install the same on every file "
                         "system; see docs/weights.md (install paths)")
        self.first = first
        self.second = second


class EmptyModelError(LockfileError):
    """A pinned model has no files (nothing would be pulled, verified, packed or served)."""

    code = "empty_model"


class EntryNotInLockError(WeightsError):
    """The requested repository has no entry in the lockfile."""

    code = "lock_entry_missing"


class DigestMismatchError(WeightsError):
    """A file's bytes differ from the digest recorded in the lockfile.

    Attributes:
        path: Repository-relative path of the file.
        expected: Expected value, prefixed by its kind (``sha256:...``, ``git-sha1:...``,
            ``size:...``).
        actual: Actual value, same form.
    """

    code = "digest_mismatch"

    def __init__(self, path: str, expected: str, actual: str) -> None:
        super().__init__(f"{path}: expected {expected}, got {actual}")
        self.path = path
        self.expected = expected
        self.actual = actual


class HubError(WeightsError):
    """The hub could not be reached or answered something unexpected."""

    code = "hub_error"


class RedirectRefusedError(HubError):
    """The hub redirected a request to a host not allowed, or from https to plain http.

    Attributes:
        host: The host the redirect pointed to.
    """

    code = "redirect_refused"

    def __init__(self, message: str, *, host: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.host = host


class HubOfflineError(HubError):
    """Offline mode is on (``HF_HUB_OFFLINE``, ``--offline``): the hub is not contacted."""

    code = "hub_offline"


class HubAnswerError(HubError):
    """The hub answered with a value that cannot be used (a commit that is not 40 hex, a blob
    id that is not a digest, a negative size)."""

    code = "hub_answer_invalid"


class HubMismatchError(HubAnswerError):
    """The hub answered for another repository, or another commit than the one asked for."""

    code = "hub_mismatch"


class UnsafeHubPathError(HubAnswerError):
    """The hub lists a file whose path could not be installed under the model's directory
    (``..``, absolute, backslash, control character, ...).

    Attributes:
        path: The path as the hub sent it.
    """

    code = "unsafe_hub_path"

    def __init__(self, message: str, *, path: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.path = path


class RepoNotFoundError(HubError):
    """The repository does not exist on the hub (or is private and no token was given)."""

    code = "repo_not_found"


class RevisionNotFoundError(HubError):
    """The branch, tag or commit does not exist in the repository."""

    code = "revision_not_found"


class FileNotOnHubError(HubError):
    """A file is absent from the repository at the pinned commit."""

    code = "entry_not_found"


class GatedRepoError(HubError):
    """The repository is gated and the request carried no token with access."""

    code = "gated_repo"


class LicenseRefusedError(WeightsError):
    """The model's licence is not in the ``--allow-license`` list."""

    code = "license_refused"


class DriftError(WeightsError):
    """The requested branch now resolves to another commit than the one pinned.

    Attributes:
        drift: The :class:`weights.pin.Drift` (added, removed, changed files), if known.
    """

    code = "revision_drift"

    def __init__(self, message: str, *, hint: str | None = None, drift: object = None) -> None:
        super().__init__(message, hint=hint)
        self.drift = drift


class CacheLayoutError(WeightsError):
    """A Hugging Face cache tree cannot be used (missing snapshot, foreign symlink, ...)."""

    code = "cache_layout"


class StorageError(WeightsError):
    """A local file cannot be written (disk full, file too large, permission, read-only)."""

    code = "io_error"


class SigningError(WeightsError):
    """A key, certificate, trust root or signature file cannot be read or used."""

    code = "signing_error"


class SignatureVerificationError(WeightsError):
    """The signature does not verify for these files and this key or identity."""

    code = "signature_invalid"


class SizingError(WeightsError):
    """A config.json or safetensors header needed for sizing is missing or malformed."""

    code = "sizing_error"


class TargetNotFoundError(WeightsError):
    """A model given on the command line (directory, config.json) is neither on disk nor a hub
    repo id."""

    code = "target_not_found"


class OutputExistsError(WeightsError):
    """A file the command would write exists and is not replaced without ``--force`` (a
    signature someone may still rely on)."""

    code = "output_exists"


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


class RemoteCodeRefused(UnsafeSerialisationError):
    """A file that ``trust_remote_code`` would run, refused without ``allow_remote_code``."""

    code = "remote_code"
