"""Identity errors: each a 401 or 403 in the OpenAI error shape with a stable code.

Tree::

    GatewayError
    ├── TokenRejected        401  token_* / client_cert_*  (authentication_error)
    └── IdentityNotAllowed   403  identity_not_mapped / credential_not_accepted
"""

from __future__ import annotations

from typing import Any

from gateway.errors import GatewayError

__all__ = ["IdentityNotAllowed", "TokenRejected"]


class TokenRejected(GatewayError):
    """A bearer token or client certificate that does not verify.

    Codes: ``token_too_large``, ``token_malformed``, ``token_alg_refused``,
    ``token_header_refused`` (``jku``/``x5u``/``jwk``/``x5c``/``crit``), ``token_issuer_unknown``,
    ``token_key_unknown``, ``token_key_revoked``, ``token_signature_invalid``,
    ``token_expired``, ``token_not_yet_valid``, ``token_audience_invalid``,
    ``token_issuer_invalid``, ``token_claim_missing``, ``token_invalid``,
    ``client_cert_untrusted``.
    """

    status = 401
    type = "authentication_error"

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message, code=code,
                         headers={"www-authenticate": 'Bearer realm="sovereign-gateway", '
                                                      'error="invalid_token"'})
        self.verified: Any = None
        """The :class:`~gateway.identity.verify.Verified` token when every check but the
        audience held (``token_audience_invalid`` on a resource-bound path): who it was."""
        self.identity: dict[str, Any] | None = None
        """Then the caller's audit fields (issuer, subject pseudonym, ``kid``), as for
        :class:`IdentityNotAllowed`."""


class IdentityNotAllowed(GatewayError):
    """A verified identity that no rule maps, or a credential this path does not accept."""

    status = 403
    type = "permission_error"

    def __init__(self, message: str, code: str = "identity_not_mapped") -> None:
        super().__init__(message, code=code)
        self.identity: dict[str, Any] | None = None
        """The verified identity's audit fields when it was verified and then refused."""
