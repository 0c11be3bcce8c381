"""Who is asking: OIDC/JWT bearer tokens and mTLS client certificates beside API keys.

Public API::

    IdentitySettings, IssuerSettings, IdentityRule, MtlsSettings   the ``identity:`` section
    Identity                     a verified caller (``Principal.identity``)
    TokenRejected (401), IdentityNotAllowed (403)

The authenticator depends on the gateway core and is imported from its modules:
``gateway.identity.auth.IdentityAuthenticator`` (keys + tokens + client certificates),
``gateway.identity.build.wrap_identity(settings, keys)`` (reads and pins the JWKS files) and
``identity_files(settings)`` (what a live reload watches).
"""

from gateway.identity.errors import IdentityNotAllowed, TokenRejected
from gateway.identity.model import Identity
from gateway.identity.settings import IdentityRule, IdentitySettings, IssuerSettings, MtlsSettings

__all__ = [
    "Identity",
    "IdentityNotAllowed",
    "IdentityRule",
    "IdentitySettings",
    "IssuerSettings",
    "MtlsSettings",
    "TokenRejected",
]
