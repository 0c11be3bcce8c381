"""Keyed pseudonymisation of identities and content digests (HMAC-SHA256, RFC 2104).

The key lives outside the audit log (a file readable by the gateway only), so the log alone
does not reveal client addresses, and whoever holds the key can still answer "did address X
make this request?" by recomputing the pseudonym. Different kinds of values are separated by a
domain label so a pseudonymised address can never equal a content digest.

Key file: base64 of at least 32 random bytes (``gateway audit keygen --pseudonym-key``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from pathlib import Path

from clishell import read_input_text, write_atomic
from gateway.audit.errors import AuditConfigError, KeyExistsError

MIN_KEY_BYTES = 32
PREFIX = "hmac-sha256:"


class Pseudonymizer:
    """Turns identities and content into keyed digests (the key is never exposed)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise AuditConfigError(f"pseudonym key must be at least {MIN_KEY_BYTES} bytes")
        self._key = key

    def __repr__(self) -> str:
        return "Pseudonymizer(<key hidden>)"

    def _mac(self, domain: str, data: bytes) -> str:
        mac = hmac.new(self._key, domain.encode() + b"\x00" + data, hashlib.sha256)
        return PREFIX + mac.hexdigest()

    def pseudonymize(self, value: str, domain: str = "client") -> str:
        """Return ``hmac-sha256:<hex>`` of ``value`` under ``domain`` (e.g. ``client``)."""
        return self._mac(domain, value.encode("utf-8"))

    def content_digest(self, content: bytes) -> str:
        """Return the keyed digest of prompt or completion bytes (never the text itself).

        ``hmac-sha256:`` + hex of HMAC-SHA256(key, ``b"content\\x00"`` + content) (RFC 2104).
        """
        return self._mac("content", content)

    def content_hasher(self) -> ContentHasher:
        """Return an incremental :meth:`content_digest` (for streamed responses)."""
        return ContentHasher(hmac.new(self._key, b"content\x00", hashlib.sha256))


class ContentHasher:
    """Incremental keyed content digest: ``update`` chunks, then ``digest``.

    ``digest()`` equals ``Pseudonymizer.content_digest(b"".join(chunks))``.
    """

    __slots__ = ("_mac",)

    def __init__(self, mac: hmac.HMAC) -> None:
        self._mac = mac

    def __repr__(self) -> str:
        return "ContentHasher(<key hidden>)"

    def update(self, chunk: bytes) -> None:
        """Add the next bytes of the content."""
        self._mac.update(chunk)

    def digest(self) -> str:
        """``hmac-sha256:<hex>`` of everything added so far."""
        return PREFIX + self._mac.copy().hexdigest()


def generate_key_file(path: Path) -> Path:
    """Write a new random pseudonym key to ``path`` (mode 0600, must not exist).

    Raises:
        AuditConfigError: If the file exists or cannot be written.
    """
    try:  # complete or absent (interrupted, disk full); never overwrites
        write_atomic(path, base64.b64encode(secrets.token_bytes(MIN_KEY_BYTES)).decode() + "\n",
                     exclusive=True, private=True)
    except FileExistsError as exc:
        raise KeyExistsError(path, "--pseudonym-key") from exc
    except OSError as exc:
        raise AuditConfigError(f"cannot write pseudonym key {path}: {exc.strerror}") from exc
    return path


def load_pseudonymizer(path: Path) -> Pseudonymizer:
    """Read a pseudonym key file.

    Raises:
        AuditConfigError: If it cannot be read or holds fewer than 32 bytes of key.
    """
    try:
        text = read_input_text(path, encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditConfigError(f"cannot read pseudonym key {path}: {exc}") from exc
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AuditConfigError(f"{path}: pseudonym key is not base64") from exc
    return Pseudonymizer(key)
