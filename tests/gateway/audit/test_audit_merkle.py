"""RFC 6962 hashing and proofs, checked against known vectors and a reference written here."""

from __future__ import annotations

import hashlib

import pytest

from gateway.audit.errors import ProofError
from gateway.audit.merkle import (
    EMPTY_ROOT,
    CompactRange,
    consistency_proof,
    inclusion_proof,
    root,
    verify_consistency,
    verify_inclusion,
)


def leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def ref_root(leaves: list[bytes]) -> bytes:
    """Textbook recursive MTH (RFC 6962 2.1), independent of the code under test."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + ref_root(leaves[:k]) + ref_root(leaves[k:])).digest()


# The RFC 6962 test inputs used by the Certificate Transparency reference implementation.
CT_INPUTS = [
    b"",
    b"\x00",
    b"\x10",
    b"\x20\x21",
    b"\x30\x31",
    b"\x40\x41\x42\x43",
    b"\x50\x51\x52\x53\x54\x55\x56\x57",
    b"\x60\x61\x62\x63\x64\x65\x66\x67\x68\x69\x6a\x6b\x6c\x6d\x6e\x6f",
]
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


def test_known_roots() -> None:
    leaves = [leaf(d) for d in CT_INPUTS]
    for n, expected in enumerate(CT_ROOTS, 1):
        assert root(leaves[:n]).hex() == expected
    assert root([]) == EMPTY_ROOT == hashlib.sha256(b"").digest()


def test_compact_range_matches_reference_for_every_size() -> None:
    leaves = [leaf(str(i).encode()) for i in range(70)]
    rng = CompactRange()
    for n in range(1, 71):
        rng.append(leaves[n - 1])
        assert rng.root() == ref_root(leaves[:n]), n


def test_inclusion_proofs_for_every_leaf_and_size() -> None:
    leaves = [leaf(bytes([i])) for i in range(33)]
    for n in range(1, 34):
        r = ref_root(leaves[:n])
        for i in range(n):
            verify_inclusion(i, n, leaves[i], inclusion_proof(i, leaves[:n]), r)


def test_inclusion_rejects_wrong_leaf_index_and_root() -> None:
    leaves = [leaf(bytes([i])) for i in range(11)]
    r = root(leaves)
    proof = inclusion_proof(5, leaves)
    with pytest.raises(ProofError):
        verify_inclusion(5, 11, leaf(b"forged"), proof, r)
    with pytest.raises(ProofError):
        verify_inclusion(4, 11, leaves[5], proof, r)
    with pytest.raises(ProofError):
        verify_inclusion(5, 11, leaves[5], proof[:-1], r)
    with pytest.raises(ProofError):
        verify_inclusion(5, 11, leaves[5], [*proof, proof[0]], r)
    with pytest.raises(ProofError):
        verify_inclusion(11, 11, leaves[5], proof, r)


def test_consistency_proofs_for_every_pair() -> None:
    leaves = [leaf(bytes([i, 1])) for i in range(21)]
    for n in range(1, 22):
        for m in range(0, n + 1):
            proof = consistency_proof(m, leaves[:n])
            verify_consistency(m, n, ref_root(leaves[:m]), ref_root(leaves[:n]), proof)


def test_consistency_rejects_a_fork() -> None:
    leaves = [leaf(bytes([i])) for i in range(13)]
    forked = list(leaves)
    forked[3] = leaf(b"rewritten")
    proof = consistency_proof(6, forked)
    with pytest.raises(ProofError):
        verify_consistency(6, 13, root(leaves[:6]), root(forked), proof)
    with pytest.raises(ProofError):
        verify_consistency(7, 7, root(leaves[:7]), root(forked[:7]), [])
    with pytest.raises(ProofError):
        verify_consistency(9, 5, root(leaves[:9]), root(leaves[:5]), [])
