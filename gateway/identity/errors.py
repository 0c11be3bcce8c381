"""Identity errors: each a 401 or 403 in the OpenAI error shape with a stable code.

Tree::

    GatewayError
    ├── TokenRejected        401  token_* / client_cert_*  (authentication_error)
    ├── IdentityNotAllowed   403  identity_not_mapped / credential_not_accepted
    └── ConfigError
        └── JwksRefused           jwks_invalid  (a key set that cannot be used, whole)
"""

from __future__ import annotations

from typing import Any

from gateway.errors import ConfigError, GatewayError

__all__ = ["IdentityNotAllowed", "JwksRefused", "TokenRejected"]


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
        # For the logs (never sent): a credential was presented and did not verify.
        self.reason = "invalid_certificate" if code.startswith("client_cert") else "invalid_token"
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


class JwksRefused(ConfigError):
    """A JWKS document (a pinned file, a fetched ``jwks_uri`` answer) that cannot be used: not
    JSON, too large or too deeply nested, not a key set, or a key the JOSE library cannot
    build. The whole document is refused; the keys in use stay.

    Attributes:
        source: Where the document came from (``identity.issuers[0].jwks_file: /path`` or
            ``jwks_uri https://...``).
        index: The position of the offending key in ``keys`` (``None``: the document).
    """

    code = "jwks_invalid"

    def __init__(self, source: str, problem: str, index: int | None = None) -> None:
        at = source if index is None else f"{source}: keys[{index}]"
        super().__init__(f"{at}: {problem}")
        self.source = source
        self.index = index
