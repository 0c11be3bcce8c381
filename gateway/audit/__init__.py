"""Tamper-evident audit log of sovereign-gateway.

Records are canonical JSON in one SHA-256 hash chain per gateway process, sealed by Ed25519
signed checkpoints (C2SP tlog-checkpoint) over the RFC 6962 Merkle tree of the records, stored
in SQLite or PostgreSQL. This package imports nothing else from ``gateway`` so the CLI can
verify a log offline.

Public API::

    log = AuditLog.from_settings(settings.audit)        # or AuditLog(open_store(url), signer, ...)
    await log.start()
    receipt = await log.append({"type": "request.started", "request_id": "...", ...})
    await log.close()

    report = await verify_store(store, verifiers=[load_verifier(path)])
    bundle = await prove(store, request_id);  verify_proof(bundle, [verifier])
"""

from gateway.audit.backends import open_store
from gateway.audit.checkpoint import (
    Checkpoint,
    Signer,
    Verifier,
    load_signer,
    load_verifier,
    open_checkpoint,
    write_key_pair,
)
from gateway.audit.errors import (
    AuditConfigError,
    AuditError,
    AuditFormatError,
    AuditUnavailable,
    NotSealedError,
    ProofError,
    RecordNotFound,
)
from gateway.audit.proof import (
    ProofReport,
    completeness_warnings,
    prove,
    verify_proof,
    verify_proof_report,
)
from gateway.audit.pseudonym import Pseudonymizer, generate_key_file, load_pseudonymizer
from gateway.audit.query import export_records, tail_records
from gateway.audit.records import Record, canonical_json
from gateway.audit.settings import AuditSettings
from gateway.audit.store import ChainInfo, Store, StoredCheckpoint
from gateway.audit.verify import verify_store
from gateway.audit.verify_report import Finding, VerifyReport
from gateway.audit.writer import AuditLog, Receipt

__all__ = [
    "AuditConfigError",
    "AuditError",
    "AuditFormatError",
    "AuditLog",
    "AuditSettings",
    "AuditUnavailable",
    "ChainInfo",
    "Checkpoint",
    "Finding",
    "NotSealedError",
    "ProofError",
    "ProofReport",
    "Pseudonymizer",
    "Receipt",
    "Record",
    "RecordNotFound",
    "Signer",
    "Store",
    "StoredCheckpoint",
    "Verifier",
    "VerifyReport",
    "canonical_json",
    "completeness_warnings",
    "export_records",
    "generate_key_file",
    "load_pseudonymizer",
    "load_signer",
    "load_verifier",
    "open_checkpoint",
    "open_store",
    "prove",
    "tail_records",
    "verify_proof",
    "verify_proof_report",
    "verify_store",
    "write_key_pair",
]
