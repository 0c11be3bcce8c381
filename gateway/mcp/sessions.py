"""Session ids of handshake-era clients (2025-03-26 .. 2025-11-25), bound to the caller.

The upstream server assigns ``Mcp-Session-Id``; the client never sees it. The gateway hands
out ``<base64url(upstream id)>.<tag>`` where the tag is an HMAC-SHA-256 (key random per
process) over the caller's key id, the server name and the upstream id. A session id presented
by another caller (or for another server, or altered) fails the tag check and is answered 404
like an unknown session, without anything being forwarded; nothing is stored per session.

Limitation: the key lives in one process, so with ``serve --workers N`` a session continues
only on the worker that opened it (modern, stateless 2026-07-28 requests have no session).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

__all__ = ["SessionBinder"]


class SessionBinder:
    """Wraps upstream session ids in caller-bound gateway session ids.

    Args:
        key: HMAC key (32 random bytes when not given).
    """

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)

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
