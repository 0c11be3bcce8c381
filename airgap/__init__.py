"""Air-gap bundles: carry pinned, verified weights across an air gap and install them offline.

Public API::

    pack_bundle(lock, source, out, key, ...) -> PackReport       connected side
    verify_bundle(bundle, trusted_keys, ...) -> VerifyReport     offline, every problem listed
    unpack_bundle(bundle, trusted_keys, store, ...) -> UnpackReport   verify, then install
                                                                  atomically (hf-cache | dir)
    Index (+ Part, Blob, ContentFile)                              the bundle format, version 1
    generate_keypair, load_private_key, load_public_key, key_id    Ed25519 keys
    AirgapError, VerificationFailed, StoreError, Problem, Code     errors with stable codes

The format is specified in docs/bundle-format.md. Nothing in this package opens a network
connection.
"""

__version__ = "0.1.0"

from airgap.bundle import (
    DEFAULT_PART_SIZE,
    FORMAT_VERSION,
    Blob,
    ContentFile,
    Index,
    Part,
)
from airgap.errors import AirgapError, Code, Problem, StoreError, VerificationFailed
from airgap.pack import PackReport, pack_bundle
from airgap.signing import (
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
)
from airgap.unpack import UnpackReport, unpack_bundle
from airgap.verify import VerifyReport, verify_bundle

__all__ = [
    "DEFAULT_PART_SIZE",
    "FORMAT_VERSION",
    "AirgapError",
    "Blob",
    "Code",
    "ContentFile",
    "Index",
    "PackReport",
    "Part",
    "Problem",
    "StoreError",
    "UnpackReport",
    "VerificationFailed",
    "VerifyReport",
    "__version__",
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "pack_bundle",
    "unpack_bundle",
    "verify_bundle",
]
