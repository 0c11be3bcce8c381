"""Records of the managed key store (times are integer Unix milliseconds, UTC)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

KEY_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def digest_hex(token: str) -> str:
    """Lower-case hex SHA-256 of the UTF-8 key: what the store keeps instead of the key."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class KeySecret:
    """One secret (hashed) of a managed key.

    Attributes:
        digest: hex SHA-256 of the key string.
        key_id: the managed key it authenticates as.
        created_at: creation time, Unix ms.
        valid_until: end of the rotation grace period (Unix ms); None while current.
    """

    digest: str
    key_id: str
    created_at: int
    valid_until: int | None = None

    def valid_at(self, now_ms: int) -> bool:
        """True when this secret still authenticates at ``now_ms``."""
        return self.valid_until is None or now_ms < self.valid_until


@dataclass(frozen=True)
class ManagedKey:
    """A key created at run time.

    Attributes:
        id: stable key id (the quota subject and the audit ``key_id``).
        team: team the key belongs to (team quotas), or None.
        models: model names it may use (``*`` for all).
        data_class: data classification of its traffic (egress policy).
        description: free text for operators.
        created_at: creation time, Unix ms.
        expires_at: expiry time, Unix ms, or None.
        revoked_at: revocation time, Unix ms, or None.
        secrets: its secrets, newest first (during a rotation grace period there are two).
    """

    id: str
    team: str | None
    models: tuple[str, ...]
    data_class: str = "internal"
    description: str = ""
    created_at: int = 0
    expires_at: int | None = None
    revoked_at: int | None = None
    secrets: tuple[KeySecret, ...] = field(default=())

    def status(self, now_ms: int) -> str:
        """Return ``active``, ``rotating`` (old secret in grace), ``expired`` or ``revoked``."""
        if self.revoked_at is not None and self.revoked_at <= now_ms:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now_ms:
            return "expired"
        if any(s.valid_until is not None and s.valid_at(now_ms) for s in self.secrets):
            return "rotating"
        return "active"

    def usable_at(self, now_ms: int) -> bool:
        """True when the key itself (not a given secret) is neither revoked nor expired."""
        return self.status(now_ms) in ("active", "rotating")
