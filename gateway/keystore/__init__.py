"""Managed API keys: created at run time, stored hashed in the audit store's database.

Public API::

    KeystoreSettings                       the ``keystore:`` configuration section
    open_keystore(url) -> KeyStore         SQLite (``sqlite:///path``) or PostgreSQL
    KeyManager(store, audit=log.append)    create / list / revoke / rotate (audited)
    ManagedKeyCache(store, refresh_s=2)    lookup without I/O; polls for revocations
    ManagedKeyAuthenticator(keyring, cache)  a gateway Authenticator (config keys first)
    ManagedKey, KeySecret, IssuedKey, digest_hex
    KeystoreError, KeystoreUnavailable, KeyNotFound, KeyExists, KeyStateError

``ManagedKeyAuthenticator`` is imported from ``gateway.keystore.auth`` (it depends on the
gateway core; the rest of this package does not).
"""

from gateway.keystore.backends import open_keystore
from gateway.keystore.cache import ManagedKeyCache
from gateway.keystore.errors import (
    KeyExists,
    KeyNotFound,
    KeyStateError,
    KeystoreConfigError,
    KeystoreError,
    KeystoreUnavailable,
)
from gateway.keystore.manager import IssuedKey, KeyManager, new_token
from gateway.keystore.models import KeySecret, ManagedKey, digest_hex
from gateway.keystore.settings import KeystoreSettings
from gateway.keystore.store import KeyStore

__all__ = [
    "IssuedKey",
    "KeyExists",
    "KeyManager",
    "KeyNotFound",
    "KeySecret",
    "KeyStateError",
    "KeyStore",
    "KeystoreConfigError",
    "KeystoreError",
    "KeystoreSettings",
    "KeystoreUnavailable",
    "ManagedKey",
    "ManagedKeyCache",
    "digest_hex",
    "new_token",
    "open_keystore",
]
