"""Errors of the audit subsystem.

Exception tree (each class has a stable machine ``code``)::

    AuditError                      code "audit_error"
    ├── AuditUnavailable            code "audit_unavailable"   store down: refuse the request (503)
    ├── AuditConfigError            code "audit_config"        bad URL, key file, settings
    │   └── KeyExistsError          code "audit_key_exists"    keygen onto an existing key file
    ├── AuditFormatError            code "audit_format"        malformed record, note, key, proof
    ├── ProofError                  code "audit_proof_invalid" an inclusion/consistency proof fails
    ├── NotSealedError              code "audit_not_sealed"    record newer than the last checkpoint
    └── RecordNotFound              code "audit_not_found"     no record with that request id

Foreign errors (sqlite3, asyncpg, OSError) are mapped at the store boundary with
``raise ... from exc``.
"""

from __future__ import annotations


class AuditError(Exception):
    """Base class of every audit error.

    Attributes:
        code: Stable machine-readable error code.
    """

    code = "audit_error"


class AuditUnavailable(AuditError):
    """The audit store cannot durably record right now; callers must refuse to serve."""

    code = "audit_unavailable"


class AuditConfigError(AuditError):
    """Invalid audit configuration: store URL, key file, or settings value."""

    code = "audit_config"


class KeyExistsError(AuditConfigError):
    """A key file to create exists already: a key is never overwritten.

    Attributes:
        path: The existing file.
        hint: What to do instead (there is no option to overwrite).
    """

    code = "audit_key_exists"

    def __init__(self, path: object, option: str) -> None:
        self.path = path
        self.hint = (f"keep it (checkpoints and pseudonyms made with it need it), or choose "
                     f"another {option}; remove it first only if nothing was made with it")
        super().__init__(f"{path} exists already; refusing to overwrite a key")


class AuditFormatError(AuditError):
    """Malformed data: record JSON, signed note, key file, or proof bundle."""

    code = "audit_format"


class ProofError(AuditError):
    """A Merkle inclusion or consistency proof, or a checkpoint signature, does not verify."""

    code = "audit_proof_invalid"


class NotSealedError(AuditError):
    """The requested record is not yet covered by a signed checkpoint."""

    code = "audit_not_sealed"


class RecordNotFound(AuditError):
    """No record matches the requested id."""

    code = "audit_not_found"
