"""Signed checkpoints: C2SP tlog-checkpoint bodies in C2SP signed notes, Ed25519 keys.

Sources: c2sp.org/tlog-checkpoint and c2sp.org/signed-note.

A checkpoint body is three lines, each ending in ``\\n``: the origin (here: the chain id), the
tree size in decimal, and the base64 RFC 6962 root. The signed note appends a blank line and
one line per signature: ``— <key name> <base64(key id || signature)>`` (U+2014 em dash), where
the 4-byte key id is ``SHA-256(key name || 0x0A || 0x01 || public key)[:4]`` and the Ed25519
signature covers the body including its final newline.

One signing key signs every chain of a deployment, so the key name is a deployment-wide name
(default ``sovereign-gateway/audit``) while each chain is its own origin.

Key files use the text encodings of the Go ``note`` package, so other tooling can read them:

* private: ``PRIVATE+KEY+<name>+<hex key id>+<base64(0x01 || 32-byte seed)>``
* public (verifier key): ``<name>+<hex key id>+<base64(0x01 || 32-byte public key)>``
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)

from clishell import private_key_instead, public_key_path, read_input, read_input_text, write_atomic
from gateway.audit.errors import AuditConfigError, AuditFormatError, KeyExistsError, ProofError

EM_DASH = "\u2014"
ALG_ED25519 = b"\x01"
DEFAULT_KEY_NAME = "sovereign-gateway/audit"


def _check_name(name: str) -> None:
    if not name or any(c.isspace() or c == "+" for c in name):
        raise AuditFormatError(f"invalid key name {name!r}: must be non-empty, no spaces or '+'")


def key_id(name: str, public_key: bytes) -> bytes:
    """Return the 4-byte signed-note key id of an Ed25519 key (c2sp.org/signed-note)."""
    return hashlib.sha256(name.encode() + b"\n" + ALG_ED25519 + public_key).digest()[:4]


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AuditFormatError(f"{what} is not valid base64") from exc


@dataclass(frozen=True)
class Verifier:
    """An Ed25519 verifier key of a signed-note signer."""

    name: str
    public_key: bytes

    @property
    def key_id(self) -> bytes:
        """4-byte key id."""
        return key_id(self.name, self.public_key)

    @property
    def vkey(self) -> str:
        """Text encoding ``<name>+<hex id>+<base64(0x01 || key)>``."""
        enc = base64.b64encode(ALG_ED25519 + self.public_key).decode()
        return f"{self.name}+{self.key_id.hex()}+{enc}"

    @classmethod
    def from_vkey(cls, text: str) -> Verifier:
        """Parse a verifier key.

        Raises:
            AuditFormatError: If the text is not an Ed25519 verifier key.
        """
        parts = text.strip().split("+", 2)
        if len(parts) != 3:
            raise AuditFormatError("verifier key must be <name>+<hex id>+<base64 key>")
        name, hex_id, b64 = parts
        _check_name(name)
        raw = _b64decode(b64, "verifier key")
        if len(raw) != 33 or raw[:1] != ALG_ED25519:
            raise AuditFormatError("verifier key is not an Ed25519 key")
        verifier = cls(name, raw[1:])
        if verifier.key_id.hex() != hex_id.lower():
            raise AuditFormatError("verifier key id does not match the key")
        return verifier

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Return whether ``signature`` is a valid Ed25519 signature of ``message``."""
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True


class Signer:
    """An Ed25519 signed-note signer (holds the private key; never logged or printed)."""

    def __init__(self, name: str, private_key: Ed25519PrivateKey) -> None:
        _check_name(name)
        self.name = name
        self._key = private_key
        pub = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.verifier = Verifier(name, pub)

    def __repr__(self) -> str:
        return f"Signer(name={self.name!r}, key_id={self.verifier.key_id.hex()})"

    @classmethod
    def generate(cls, name: str = DEFAULT_KEY_NAME) -> Signer:
        """Create a new random signer."""
        return cls(name, Ed25519PrivateKey.generate())

    @classmethod
    def from_skey(cls, text: str) -> Signer:
        """Parse ``PRIVATE+KEY+<name>+<hex id>+<base64(0x01 || seed)>``.

        Raises:
            AuditFormatError: If the text is not such a key.
        """
        parts = text.strip().split("+", 4)
        if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
            raise AuditFormatError("signing key must be PRIVATE+KEY+<name>+<hex id>+<base64>")
        raw = _b64decode(parts[4], "signing key")
        if len(raw) != 33 or raw[:1] != ALG_ED25519:
            raise AuditFormatError("signing key is not an Ed25519 key")
        signer = cls(parts[2], Ed25519PrivateKey.from_private_bytes(raw[1:]))
        if signer.verifier.key_id.hex() != parts[3].lower():
            raise AuditFormatError("signing key id does not match the key")
        return signer

    def skey(self) -> str:
        """Text encoding of the private key (write it with mode 0600 only)."""
        seed = self._key.private_bytes_raw()
        enc = base64.b64encode(ALG_ED25519 + seed).decode()
        return f"PRIVATE+KEY+{self.name}+{self.verifier.key_id.hex()}+{enc}"

    def sign_note(self, text: str) -> str:
        """Sign a note text (must end in a newline) and return the signed note."""
        if not text.endswith("\n") or "\n\n" in text:
            raise AuditFormatError("note text must end in one newline and contain no blank line")
        sig = self._key.sign(text.encode("utf-8"))
        enc = base64.b64encode(self.verifier.key_id + sig).decode()
        return f"{text}\n{EM_DASH} {self.name} {enc}\n"


def load_signer(path: Path, name: str = DEFAULT_KEY_NAME) -> Signer:
    """Read a signing key file: a signed-note key (``gateway audit keygen``) or a PKCS#8 PEM
    Ed25519 private key (``openssl genpkey -algorithm ed25519``), which signs as ``name``.

    Raises:
        AuditConfigError: If the file cannot be read or is not an Ed25519 signing key.
    """
    text = ""  # a file that is not UTF-8 fails in read_text itself
    try:
        text = read_input_text(path)
        if text.lstrip().startswith("-----BEGIN"):
            key = load_pem_private_key(text.encode(), password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise AuditFormatError("PEM key is not an Ed25519 private key")
            return Signer(name, key)
        return Signer.from_skey(text)
    except OSError as exc:
        raise AuditConfigError(f"cannot read signing key {path}: {exc.strerror}") from exc
    except (AuditFormatError, ValueError, TypeError) as exc:
        if _is_public_key(text):
            private = path.with_suffix("") if path.suffix == ".pub" else None
            raise AuditConfigError(
                f"{path} is a public (verifier) key, not a signing key: give the private key "
                + (f"keygen wrote next to it ({private})" if private else "keygen wrote")
            ) from exc
        raise AuditConfigError(f"{path}: {exc}") from exc


def _is_public_key(text: str) -> bool:
    """A verifier key or a PEM public key, given where the signing key belongs."""
    if text.lstrip().startswith("-----BEGIN PUBLIC KEY"):
        return True
    try:
        Verifier.from_vkey(text)
    except (AuditFormatError, ValueError, TypeError):
        return False
    return True


def load_verifier(path: Path, name: str = DEFAULT_KEY_NAME) -> Verifier:
    """Read a public key file: a signed-note verifier key, or a PEM Ed25519 public key that
    verifies signatures made as ``name``.

    Raises:
        AuditConfigError: If the file cannot be read or is not a verifier key.
    """
    try:
        data = read_input(path)
        mistake = private_key_instead(path, data)
        if mistake is not None:
            raise AuditConfigError(mistake)
        text = data.decode("utf-8")
        if text.lstrip().startswith("-----BEGIN"):
            key = load_pem_public_key(text.encode())
            if not isinstance(key, Ed25519PublicKey):
                raise AuditFormatError("PEM key is not an Ed25519 public key")
            return Verifier(name, key.public_bytes(Encoding.Raw, PublicFormat.Raw))
        return Verifier.from_vkey(text)
    except OSError as exc:
        raise AuditConfigError(f"cannot read public key {path}: {exc.strerror}") from exc
    except (AuditFormatError, ValueError, TypeError) as exc:  # UnicodeDecodeError included
        raise AuditConfigError(f"{path}: {exc}") from exc


def write_key_pair(signer: Signer, out: Path) -> tuple[Path, Path]:
    """Write ``out`` (private, mode 0600, must not exist) and its verifier key, named as every
    key file of the project (:func:`clishell.public_key_path`: ``audit.key`` ->
    ``audit.key.pub``, ``audit.pem`` -> ``audit.pub``).

    Returns:
        The private and public key paths.

    Raises:
        AuditConfigError: If a file exists already or cannot be written.
    """
    pub = public_key_path(out)
    try:
        # Each file complete or absent, and never the private key without its public one
        # (interrupted, disk full): clishell.write_atomic.
        write_atomic(out, signer.skey() + "\n", exclusive=True, private=True)
        try:
            write_atomic(pub, signer.verifier.vkey + "\n")
        except BaseException:
            out.unlink(missing_ok=True)
            raise
    except FileExistsError as exc:
        raise KeyExistsError(out, "--out") from exc
    except OSError as exc:
        raise AuditConfigError(f"cannot write key {out}: {exc.strerror}") from exc
    return out, pub


@dataclass(frozen=True)
class Checkpoint:
    """A tree head: origin (chain id), size (number of records) and RFC 6962 root."""

    origin: str
    size: int
    root: bytes

    def body(self) -> str:
        """The C2SP tlog-checkpoint note text (three lines)."""
        return f"{self.origin}\n{self.size}\n{base64.b64encode(self.root).decode()}\n"

    @classmethod
    def parse_body(cls, text: str) -> Checkpoint:
        """Parse a checkpoint note text (extension lines are ignored).

        Raises:
            AuditFormatError: If the text is not a checkpoint body.
        """
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "" or any(not line for line in lines[:-1]):
            raise AuditFormatError("checkpoint text must be >= 3 non-empty lines ending in newline")
        origin, size_s, root_s = lines[0], lines[1], lines[2]
        if not size_s.isdigit() or (size_s != "0" and size_s.startswith("0")):
            raise AuditFormatError(f"checkpoint size {size_s!r} is not a decimal number")
        root = _b64decode(root_s, "checkpoint root")
        if len(root) != 32:
            raise AuditFormatError("checkpoint root is not 32 bytes")
        return cls(origin, int(size_s), root)


def sign_checkpoint(checkpoint: Checkpoint, signer: Signer) -> str:
    """Return the signed note of ``checkpoint``."""
    return signer.sign_note(checkpoint.body())


def split_note(note: str) -> tuple[str, list[tuple[str, bytes, bytes]]]:
    """Split a signed note into its text and ``(key name, key id, signature)`` lines.

    Raises:
        AuditFormatError: If the note is malformed.
    """
    idx = note.rfind("\n\n")
    if idx < 0 or not note.endswith("\n"):
        raise AuditFormatError("signed note has no signature block")
    text, sig_block = note[: idx + 1], note[idx + 2 :]
    sigs: list[tuple[str, bytes, bytes]] = []
    for line in sig_block.split("\n")[:-1]:
        parts = line.split(" ")
        if len(parts) != 3 or parts[0] != EM_DASH:
            raise AuditFormatError(f"malformed signature line {line!r}")
        raw = _b64decode(parts[2], "signature")
        if len(raw) < 5:
            raise AuditFormatError("signature too short")
        sigs.append((parts[1], raw[:4], raw[4:]))
    if not sigs:
        raise AuditFormatError("signed note has no signature lines")
    return text, sigs


def open_checkpoint(note: str, verifiers: Sequence[Verifier]) -> Checkpoint:
    """Verify a signed checkpoint against trusted keys and parse it.

    The first signature line whose key name and key id match a trusted key decides: a valid
    signature accepts, an invalid one rejects; lines of unknown keys are ignored
    (c2sp.org/signed-note).

    Args:
        note: Signed note text.
        verifiers: Trusted verifier keys.

    Returns:
        The verified checkpoint.

    Raises:
        AuditFormatError: If the note is malformed.
        ProofError: If no trusted key signed it, or the signature is invalid.
    """
    text, sigs = split_note(note)
    for name, kid, sig in sigs:
        for verifier in verifiers:
            if verifier.name == name and verifier.key_id == kid:
                if not verifier.verify(text.encode("utf-8"), sig):
                    raise ProofError(f"invalid signature by trusted key {name}")
                return Checkpoint.parse_body(text)
    names = ", ".join(f"{n}+{k.hex()}" for n, k, _ in sigs)
    raise ProofError(f"checkpoint not signed by a trusted key (signed by: {names})")


def parse_checkpoint_unverified(note: str) -> Checkpoint:
    """Parse a signed checkpoint WITHOUT checking signatures (for display and root checks).

    Raises:
        AuditFormatError: If the note is malformed.
    """
    text, _ = split_note(note)
    return Checkpoint.parse_body(text)
