"""Session ids of handshake-era clients (2025-03-26 .. 2025-11-25), bound to the caller.

The upstream server assigns ``Mcp-Session-Id``; the client never sees it. The gateway hands
out ``<base64url(upstream id)>.<tag>`` where the tag is an HMAC-SHA-256 over the caller's key
id, the server name and the upstream id. A session id presented by another caller (or for
another server, or altered) fails the tag check and is answered 404 like an unknown session,
without anything being forwarded; nothing is stored per session.

The HMAC key is ``mcp.session_key_file`` (base64 of at least 32 random bytes, the format of the
audit pseudonym key; a mounted Secret shared by every worker and replica), so a session opened
on one worker or pod continues on any other. Without it the key is random per process: a
session then continues only in the process that opened it (``serve --workers 1``, one
replica). Modern, stateless 2026-07-28 requests have no session.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from pathlib import Path

__all__ = ["MIN_KEY_BYTES", "SessionBinder", "load_session_key"]

MIN_KEY_BYTES = 32


def load_session_key(path: Path) -> bytes:
    """Read a session key file: one line, base64 of at least ``MIN_KEY_BYTES`` bytes.

    Raises:
        ValueError: The file cannot be read, is not base64, or holds too short a key (the
            message says which).
    """
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{path}: not base64") from exc
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{path}: the key must be at least {MIN_KEY_BYTES} bytes "
                         f"(has {len(key)})")
    return key


class SessionBinder:
    """Wraps upstream session ids in caller-bound gateway session ids.

    Args:
        key: HMAC key (at least 32 bytes; 32 random bytes, this process only, when not given).
    """

    def __init__(self, key: bytes | None = None) -> None:
        if key is not None and len(key) < MIN_KEY_BYTES:
            raise ValueError(f"session key must be at least {MIN_KEY_BYTES} bytes")
        self._key = key if key is not None else secrets.token_bytes(MIN_KEY_BYTES)

    def _tag(self, key_id: str, server: str, upstream: str) -> str:
        mac = hmac.new(self._key, b"\0".join(
            (key_id.encode(), server.encode(), upstream.encode("latin-1"))), hashlib.sha256)
        return base64.urlsafe_b64encode(mac.digest()[:18]).decode().rstrip("=")

    def wrap(self, key_id: str, server: str, upstream: str) -> str:
        """The gateway session id for the caller of an upstream session id."""
        body = base64.urlsafe_b64encode(upstream.encode("latin-1")).decode().rstrip("=")
        return f"{body}.{self._tag(key_id, server, upstream)}"

    def unwrap(self, key_id: str, server: str, presented: str) -> str | None:
        """The upstream session id, or ``None`` when ``presented`` is not this caller's."""
        body, sep, tag = presented.partition(".")
        if not sep or len(presented) > 1024:
            return None
        try:
            upstream = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode("latin-1")
        except (binascii.Error, ValueError):
            return None
        if not hmac.compare_digest(tag, self._tag(key_id, server, upstream)):
            return None
        return upstream
