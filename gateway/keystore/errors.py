"""Errors of the managed key store.

Tree (each class has a stable machine ``code``)::

    KeystoreError                  code "keystore_error"
    ├── KeystoreConfigError        code "keystore_config_invalid" (bad URL, bad option)
    ├── KeystoreUnavailable        code "keystore_unavailable" (store unreachable / cache stale)
    ├── KeyNotFound                code "key_not_found"
    ├── KeyExists                  code "key_exists"
    └── KeyStateError              code "key_state_invalid" (e.g. rotating a revoked key)
"""

from __future__ import annotations


class KeystoreError(Exception):
    """Base of every keystore error (``code``: stable machine-readable code)."""

    code = "keystore_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class KeystoreConfigError(KeystoreError):
    """The store URL or an option is invalid."""

    code = "keystore_config_invalid"


class KeystoreUnavailable(KeystoreError):
    """The store cannot be reached, or the cache is older than its staleness bound."""

    code = "keystore_unavailable"


class KeyNotFound(KeystoreError):
    """No managed key has this id."""

    code = "key_not_found"


class KeyExists(KeystoreError):
    """A managed key with this id already exists."""

    code = "key_exists"


class KeyStateError(KeystoreError):
    """The key is in a state that forbids the action (revoked, expired)."""

    code = "key_state_invalid"
