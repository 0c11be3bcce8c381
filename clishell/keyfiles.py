"""One naming scheme for key files: ``NAME.pem`` (private) and ``NAME.pub`` (public).

Every ``keygen`` of the project (``weights keygen``, ``airgap keygen``, ``gateway audit
keygen``) writes the public key next to the private key under :func:`public_key_path`'s name:
the private key's name without ``.pem``, plus ``.pub`` (``site-signing.pem`` ->
``site-signing.pub``; ``audit.key`` -> ``audit.key.pub``), as OpenSSH does. Earlier
``weights keygen`` and ``airgap keygen`` wrote ``NAME.pub.pem``; :func:`existing_public_key`
still finds such a file when a command is given the new name (or the old name of a key made
since), with a deprecation warning.
"""

from __future__ import annotations

from pathlib import Path

from clishell.errors import warn

__all__ = [
    "LEGACY_PUBLIC_SUFFIX", "PUBLIC_SUFFIX", "existing_public_key", "private_key_instead",
    "public_key_path",
]

PUBLIC_SUFFIX = ".pub"
#: What ``weights keygen`` / ``airgap keygen`` wrote before (accepted, with a warning).
LEGACY_PUBLIC_SUFFIX = ".pub.pem"

# How the private keys of the project's keygens (and of openssl/ssh-keygen) begin: PEM
# "PRIVATE KEY" blocks (PKCS#8, SEC1 "EC PRIVATE KEY", "ENCRYPTED PRIVATE KEY", "OPENSSH PRIVATE
# KEY", ...) and signed-note signer keys (``gateway audit keygen``).
_PRIVATE_MARKERS = (b"PRIVATE KEY-----", b"PRIVATE+KEY+")


def public_key_path(private_key_path: Path) -> Path:
    """The public key file of ``private_key_path``: ``KEY.pem`` -> ``KEY.pub``.

    Any other name gets ``.pub`` appended (``audit.key`` -> ``audit.key.pub``).

    Args:
        private_key_path: Where the private key is (or will be) written.

    Returns:
        The path of its public key, in the same directory.
    """
    name = private_key_path.name.removesuffix(".pem")
    return private_key_path.with_name(name + PUBLIC_SUFFIX)


def _other_name(path: Path) -> Path | None:
    name = path.name
    if name.endswith(LEGACY_PUBLIC_SUFFIX):
        return path.with_name(name.removesuffix(LEGACY_PUBLIC_SUFFIX) + PUBLIC_SUFFIX)
    if name.endswith(PUBLIC_SUFFIX):
        return path.with_name(name.removesuffix(PUBLIC_SUFFIX) + LEGACY_PUBLIC_SUFFIX)
    return None


def existing_public_key(path: Path, prog: str) -> Path:
    """The public key file to read for ``path`` as an operator gave it.

    ``path`` itself if it exists. If it does not, but the same key under the other scheme's
    name does (``KEY.pub`` given and the old ``KEY.pub.pem`` on disk, or a script still naming
    ``KEY.pub.pem`` for a key made as ``KEY.pub``), that file, after a ``deprecated`` warning on
    standard error. Otherwise ``path`` (the command then reports it missing, by that name).

    Args:
        path: The public key path from the command line.
        prog: The command's name, for the warning line.

    Returns:
        The path to read.
    """
    if path.exists():
        return path
    other = _other_name(path)
    if other is None or not other.is_file():
        return path
    if other.name.endswith(LEGACY_PUBLIC_SUFFIX):
        warn(prog, "deprecated", f"{path} not found; reading {other}, the old name of public "
             "key files", hint=f"rename it to {path.name}")
    else:
        warn(prog, "deprecated", f"{path} not found; reading {other} (public keys are now "
             "named KEY.pub)", hint=f"pass {other}")
    return other


def private_key_instead(path: Path, data: bytes) -> str | None:
    """Why ``data``, read from ``path`` where a public key was expected, is a private key.

    Verifying commands take the public key; handing them the private key is a common slip
    (``--public-key audit.key``) that a key parser reports as a puzzling format error. This
    names the mistake and the file to pass instead. Nothing of the key is quoted.

    Args:
        path: The file as the operator named it.
        data: Its content.

    Returns:
        One line for the error message (what, where, what to pass), or ``None`` when ``data``
        is not a private key.
    """
    head = data[:4096]
    if not any(marker in head for marker in _PRIVATE_MARKERS):
        return None
    return (f"{path} is a private (signing) key, not a public key: pass its public key "
            f"({public_key_path(path)}, written next to it by keygen), and keep the private "
            "key where only the signer can read it")
