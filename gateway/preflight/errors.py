"""Errors of ``gateway preflight`` (all :class:`~gateway.errors.GatewayError`)::

    GatewayError
     +-- PreflightError                 code preflight_error
          +-- PreflightInputError       an input cannot be read or used (exit 2)
          +-- EvidenceError             an evidence pack cannot be written or read (exit 2)
"""

from __future__ import annotations

from gateway.errors import GatewayError

__all__ = ["EvidenceError", "PreflightError", "PreflightInputError"]


class PreflightError(GatewayError):
    """Base of the pre-flight errors."""

    code = "preflight_error"


class PreflightInputError(PreflightError):
    """An input (config, policy, values, admin URL, kubeconfig, lockfile) cannot be used."""

    code = "preflight_input"


class EvidenceError(PreflightError):
    """An evidence pack cannot be written, or is not a pack (missing envelope, bad JSON)."""

    code = "preflight_evidence"
