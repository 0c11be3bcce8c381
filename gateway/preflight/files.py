"""Start-up check of the files the continuous pre-flight section names (``preflight:``)."""

from __future__ import annotations

from gateway.audit import AuditError, load_verifier
from gateway.errors import ConfigError
from gateway.preflight.errors import EvidenceError
from gateway.preflight.evidence import load_signing_key
from gateway.preflight.live_settings import ContinuousSettings

__all__ = ["check_preflight_files"]


def check_preflight_files(section: ContinuousSettings | None) -> None:
    """Load the files the rounds will use, so a wrong path fails at start, naming the key.

    Without it ``gateway serve`` started and every round failed ``audit.verify`` (or never
    wrote a pack) for a key file that was misspelt. Run by ``check-config`` and ``serve``
    (:func:`gateway.assembly.assemble`).

    Raises:
        ConfigError: ``preflight.audit_public_key`` is not a readable verifier key,
            ``preflight.sign_key_file`` not an Ed25519 private key, or ``preflight.evidence_dir``
            exists and is not a directory.
    """
    if section is None or not section.enabled:
        return
    if section.audit_public_key is not None:
        try:
            load_verifier(section.audit_public_key)
        except AuditError as exc:
            raise ConfigError(f"preflight.audit_public_key: {exc}") from exc
    if section.sign_key_file is not None:
        try:
            load_signing_key(section.sign_key_file)
        except EvidenceError as exc:
            raise ConfigError(f"preflight.sign_key_file: {exc}") from exc
    ev = section.evidence_dir
    if ev is not None and ev.exists() and not ev.is_dir():
        raise ConfigError(f"preflight.evidence_dir: {ev} exists and is not a directory")
