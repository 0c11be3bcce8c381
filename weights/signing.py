"""OpenSSF model signing: sign and verify model directories, interoperable with ``model_signing``.

Format (OpenSSF model-signing v1.0, see /work/shared/FORMATS.md): a Sigstore bundle v0.3
holding a DSSE envelope whose payload is an in-toto Statement v1 with predicate type
``https://model_signing/signature/v1.0``; the predicate lists ``resources`` of
``{name, algorithm: "sha256", digest}`` per file (``serialization.method = "files"``).

The envelope, statement and signature are produced and checked by the ``model_signing``
library; the per-file digests are computed here, once (or taken from a lock verification that
already hashed the files), and compared here, so a failure names the files that differ.

Key mode (EC P-256/384/521 PEM) is fully offline. Keyless (Sigstore) signatures are checked
against an explicit identity, OIDC issuer and trust root file (``trusted_root.json`` or a
Sigstore ``ClientTrustConfig``); nothing is fetched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, cast

from clishell import not_regular, private_key_instead, read_input
from weights.digests import ProgressCallback, sha256_file
from weights.errors import SignatureVerificationError, SigningError
from weights.verify import list_files

#: The keys ``weights sign`` / ``weights verify --public-key`` take: OpenSSF model signing's key
#: mode (``model_signing sign key``) signs with ECDSA on these NIST curves only.
SUPPORTED_KEYS = "EC P-256, P-384 or P-521 keys (PEM)"
_CURVES = ("secp256r1", "secp384r1", "secp521r1")

#: Paths model_signing leaves out by default (``ignore_git_paths=True``), as fnmatch globs.
GIT_PATHS = (".git", ".git/*", ".gitattributes", ".github", ".github/*", ".gitignore")


def signed_files(root: Path, ignore: Iterable[str] = ()) -> list[str]:
    """Return the relative POSIX paths that a signature over ``root`` covers (sorted).

    Everything under ``root`` except git metadata (as model_signing does) and ``ignore``
    globs.
    """
    return list_files(root, skip_dirs=(".git",), ignore=[*GIT_PATHS, *ignore])


def compute_digests(
    root: Path,
    paths: Iterable[str],
    known: Mapping[str, str] | None = None,
    progress: ProgressCallback | None = None,
) -> dict[str, str]:
    """Return ``{path: sha256 hex}``, hashing only the files not in ``known``."""
    out: dict[str, str] = {}
    for p in paths:
        if known is not None and p in known:
            out[p] = known[p]
        else:
            out[p] = sha256_file(root / p, progress)
    return out


def _key_kind(key: object) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        return f"EC {key.curve.name}"
    if isinstance(key, ed25519.Ed25519PrivateKey | ed25519.Ed25519PublicKey):
        return "Ed25519"
    return type(key).__name__.lstrip("_")


def check_key(path: Path, *, private: bool, password: str | None = None) -> None:
    """Refuse, in one line, a key that model signing cannot use (before any hashing).

    Args:
        path: PEM file.
        private: A private key (``sign``) or a public key (``verify``).
        password: Password of an encrypted private key.

    Raises:
        SigningError: Unreadable, not PEM, wrong password, or not one of ``SUPPORTED_KEYS``
            (an Ed25519 key from ``airgap keygen`` is named as such).
    """
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if not_regular(path):  # model_signing reads the key file again by name
        raise SigningError(f"{path}: not a regular file (a pipe or FIFO is read once; the "
                           "signing library reads the key again by name): give a key file")
    try:
        data = read_input(path)
    except OSError as exc:
        raise SigningError(f"{path}: cannot read key: {exc.strerror or exc}") from exc
    mistake = None if private else private_key_instead(path, data)
    if mistake is not None:
        raise SigningError(mistake)
    try:
        key: object = (serialization.load_pem_private_key(
            data, password.encode() if password else None) if private
            else serialization.load_pem_public_key(data))
    except TypeError as exc:  # password given for a plain key, or missing for an encrypted one
        raise SigningError(f"{path}: {exc}") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        what = "private" if private else "public"
        raise SigningError(f"{path}: not a PEM {what} key (or wrong password); weights "
                           f"signing takes {SUPPORTED_KEYS}") from exc
    ok = isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey) and \
        key.curve.name in _CURVES
    if not ok:
        origin = " (as `airgap keygen` makes, for bundles)" if _key_kind(key) == "Ed25519" else ""
        raise SigningError(
            f"{path}: {_key_kind(key)} key{origin} is not supported: weights signing (OpenSSF "
            f"model signing) takes {SUPPORTED_KEYS}; make one with `weights keygen`")


def generate_key(out: Path) -> Path:
    """Write a new EC P-256 signing key to ``out`` (PKCS#8 PEM, mode 0600) and its public key
    to :func:`clishell.public_key_path` of it (``KEY.pem`` -> ``KEY.pub``, SubjectPublicKeyInfo
    PEM); neither may exist yet.

    Returns:
        The public key path.

    Raises:
        SigningError: A file exists or cannot be written (nothing is left half-written).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from clishell import public_key_path

    pub = public_key_path(out)
    key = ec.generate_private_key(ec.SECP256R1())
    private_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)
    written: list[Path] = []
    try:
        for path, data, mode in ((out, private_pem, 0o600), (pub, public_pem, 0o644)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            written.append(path)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
    except FileExistsError as exc:
        for p in written:
            p.unlink(missing_ok=True)
        raise SigningError(f"{exc.filename} exists; choose another --out") from exc
    except BaseException as exc:
        for p in written:
            p.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise SigningError(f"cannot write {exc.filename}: {exc.strerror or exc}") from exc
        raise
    return pub


def _manifest(name: str, digests: Mapping[str, str], ignore: Iterable[str], symlinks: bool) -> Any:
    from model_signing import manifest
    from model_signing._hashing import hashing

    serialization = manifest._FileSerialization(
        "sha256", allow_symlinks=symlinks, ignore_paths=[Path(p) for p in ignore]
    )
    items = [
        manifest.FileManifestItem(
            path=PurePosixPath(p), digest=hashing.Digest("sha256", bytes.fromhex(h))
        )
        for p, h in sorted(digests.items())
    ]
    return manifest.Manifest(name, items, serialization)


def sign_model(
    root: str | os.PathLike[str],
    key: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    password: str | None = None,
    ignore: Iterable[str] = (),
    digests: Mapping[str, str] | None = None,
    progress: ProgressCallback | None = None,
) -> dict[str, str]:
    """Sign every file under ``root`` with an EC private key; write the bundle to ``out``.

    Args:
        root: Model directory (plain or HF snapshot; symlinks are followed).
        key: PEM EC private key (P-256, P-384 or P-521; ``weights keygen`` makes one). An
            Ed25519 key (``airgap keygen``, for bundles) is refused: model signing's key mode
            is ECDSA only.
        out: Signature path; excluded from the signed files if inside ``root``.
        password: Key password, if encrypted.
        ignore: Extra globs (relative paths) to leave out.
        digests: sha256 already computed for some paths (e.g. by a lock verification).
        progress: Byte-count callback while hashing.

    Returns:
        The signed ``{path: sha256}``.

    Raises:
        SigningError: Unreadable or unsupported key, unwritable output, nothing to sign.
    """
    from model_signing._signing import sign_ec_key, signing

    r = Path(root)
    check_key(Path(key), private=True, password=password)
    ignore = list(ignore)
    o = Path(out).resolve()
    if o.is_relative_to(r.resolve()):
        ignore.append(o.relative_to(r.resolve()).as_posix())
    paths = signed_files(r, ignore)
    if not paths:
        raise SigningError(f"{r}: no files to sign")
    for p in paths:
        try:
            p.encode("utf-8")
        except UnicodeEncodeError:  # an undecodable byte name, kept by os.fsdecode
            shown = p.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise SigningError(
                f"{r}/{shown}: file name is not valid UTF-8; the signature (in-toto JSON) "
                "cannot name it", hint="rename or remove the file, or leave it out with --ignore",
            ) from None
    computed = compute_digests(r, paths, digests, progress)
    symlinks = any((r / p).is_symlink() for p in paths)
    try:
        signer = sign_ec_key.Signer(
            Path(key),
            # model_signing types it str but hands it to cryptography, which needs bytes.
            cast(Any, password.encode()) if password else None,
        )
    except (OSError, ValueError, TypeError) as exc:
        raise SigningError(f"{key}: cannot use as an EC private key: {exc}") from exc
    signature = signer.sign(signing.Payload(_manifest(r.name, computed, ignore, symlinks)))
    tmp = o.with_name(f".{o.name}.{os.getpid()}.tmp")  # never a half-written signature
    try:
        signature.write(tmp)
        os.replace(tmp, o)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise SigningError(f"cannot write {o}: {exc.strerror or exc}") from exc
        raise
    return computed


def _keyless_verifier(identity: str, issuer: str, trust_root: Path) -> Any:
    from model_signing._signing import sign_sigstore
    from sigstore import models as sigstore_models
    from sigstore import verify as sigstore_verify

    try:
        doc = json.loads(trust_root.read_text(encoding="utf-8"))
        if isinstance(doc, dict) and "trustedRoot" in doc:
            root = sigstore_models.ClientTrustConfig.from_json(json.dumps(doc)).trusted_root
        else:
            root = sigstore_models.TrustedRoot.from_file(str(trust_root))
    except Exception as exc:
        raise SigningError(f"{trust_root}: not a Sigstore trusted root: {exc}") from exc

    class _OfflineSigstoreVerifier(sign_sigstore.Verifier):
        def __init__(self) -> None:  # no production/staging trust config lookup
            self._verifier = sigstore_verify.Verifier(trusted_root=root)
            self._policy = sigstore_verify.policy.Identity(identity=identity, issuer=issuer)

    return _OfflineSigstoreVerifier()


def _is_json(path: Path) -> bool:
    try:
        json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return True


def verify_signature(
    root: str | os.PathLike[str],
    signature: str | os.PathLike[str],
    *,
    public_key: str | os.PathLike[str] | None = None,
    identity: str | None = None,
    identity_provider: str | None = None,
    trust_root: str | os.PathLike[str] | None = None,
    ignore: Iterable[str] = (),
    digests: Mapping[str, str] | None = None,
    progress: ProgressCallback | None = None,
) -> dict[str, str]:
    """Verify a model_signing signature over ``root``, offline.

    Give either ``public_key`` (key mode) or ``identity`` + ``identity_provider`` +
    ``trust_root`` (keyless Sigstore mode).

    Returns:
        The verified ``{path: sha256}``.

    Raises:
        SignatureVerificationError: Bad signature, wrong key/identity, or files that differ
            from the signed manifest (message lists them).
        SigningError: Missing or unreadable key, trust root or signature file.
    """
    from model_signing._signing import sign_ec_key, sign_sigstore, sign_sigstore_pb

    r = Path(root)
    sig = Path(signature)
    if not sig.is_file():
        raise SigningError(f"{sig}: signature file not found")
    if public_key is not None:
        check_key(Path(public_key), private=False)
    try:
        if public_key is not None:
            verifier: Any = sign_ec_key.Verifier(Path(public_key))
            bundle: Any = sign_sigstore_pb.Signature.read(sig)
        elif identity and identity_provider and trust_root:
            verifier = _keyless_verifier(identity, identity_provider, Path(trust_root))
            try:
                bundle = sign_sigstore.Signature.read(sig)
            except Exception as exc:
                if _is_json(sig):  # a readable bundle without a certificate: not theirs
                    raise SignatureVerificationError(
                        f"{sig}: not a keyless Sigstore signature ({exc})"
                    ) from exc
                raise
        else:
            raise SigningError(
                "give --public-key, or --identity, --identity-provider and --trust-root"
            )
    except (SigningError, SignatureVerificationError):
        raise
    except Exception as exc:
        raise SigningError(f"cannot load key or signature: {exc}") from exc
    try:
        expected = verifier.verify(bundle)
    except Exception as exc:  # the library raises ValueError and sigstore errors
        raise SignatureVerificationError(f"{sig}: signature does not verify: {exc}") from exc
    want = {rd.identifier: rd.digest.digest_hex for rd in expected.resource_descriptors()}
    ignored = list(ignore) + [str(p) for p in expected.serialization_type.get("ignore_paths", [])]
    s = sig.resolve()
    if s.is_relative_to(r.resolve()):
        ignored.append(s.relative_to(r.resolve()).as_posix())
    present = signed_files(r, ignored)
    have = compute_digests(r, [p for p in present if p in want], digests, progress)
    problems = [f"missing {p}" for p in sorted(want.keys() - set(present))]
    problems += [f"unsigned {p}" for p in sorted(set(present) - want.keys())]
    problems += [
        f"modified {p}: signed sha256:{want[p]}, actual sha256:{h}"
        for p, h in sorted(have.items()) if want[p] != h
    ]
    if problems:
        raise SignatureVerificationError(f"{sig}: " + "; ".join(problems))
    return want
