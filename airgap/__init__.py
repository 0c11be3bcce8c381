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

from typing import TYPE_CHECKING, Any

from airgap.version import __version__

if TYPE_CHECKING:  # the names for type checkers; at run time they load on first use
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

#: Public name -> defining module. Loaded lazily (PEP 562) so that a command such as
#: ``airgap verify`` does not pay for importing pack and unpack (docs/airgap.md, start-up).
_LAZY = {
    **dict.fromkeys(("DEFAULT_PART_SIZE", "FORMAT_VERSION", "Blob", "ContentFile", "Index",
                     "Part"), "airgap.bundle"),
    **dict.fromkeys(("AirgapError", "Code", "Problem", "StoreError", "VerificationFailed"),
                    "airgap.errors"),
    **dict.fromkeys(("PackReport", "pack_bundle"), "airgap.pack"),
    **dict.fromkeys(("generate_keypair", "key_id", "load_private_key", "load_public_key"),
                    "airgap.signing"),
    **dict.fromkeys(("UnpackReport", "unpack_bundle"), "airgap.unpack"),
    **dict.fromkeys(("VerifyReport", "verify_bundle"), "airgap.verify"),
}


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access (PEP 562).

    Raises:
        AttributeError: ``name`` is not a public name of the package (nor a submodule).
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'airgap' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


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
