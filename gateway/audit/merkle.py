"""RFC 6962 Merkle tree hashing, proofs and proof verification.

Source: RFC 6962 section 2.1 (tree hash, audit paths, consistency proofs) and the
verification algorithms of RFC 9162 sections 2.1.3.2 and 2.1.4.2.

* leaf hash ``SHA-256(0x00 || data)`` (see :func:`gateway.audit.records.record_hash`),
* node hash ``SHA-256(0x01 || left || right)``,
* a tree of ``n > 1`` leaves splits at ``k``, the largest power of two smaller than ``n``,
* the empty tree hashes to ``SHA-256("")``.

All functions here work on *leaf hashes* (32-byte values), never on raw leaf data.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from gateway.audit.errors import ProofError

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """Return ``SHA-256(0x01 || left || right)``."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """Largest power of two strictly smaller than ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


def root(leaves: Sequence[bytes]) -> bytes:
    """Merkle tree hash (MTH) of a list of leaf hashes.

    Args:
        leaves: Leaf hashes, 32 bytes each.

    Returns:
        The 32-byte root; :data:`EMPTY_ROOT` for no leaves.
    """
    rng = CompactRange()
    for leaf in leaves:
        rng.append(leaf)
    return rng.root()


class CompactRange:
    """Incremental RFC 6962 root: the perfect subtrees of the leaves seen so far.

    Appending is O(log n) amortised and :meth:`root` is O(log n), so a writer can sign a
    checkpoint at any size without re-reading the log.
    """

    __slots__ = ("_nodes", "last_leaf", "size")

    def __init__(self) -> None:
        self.size = 0
        self.last_leaf = b""
        # (height, hash) of perfect subtrees, left to right, heights strictly decreasing.
        self._nodes: list[tuple[int, bytes]] = []

    def copy(self) -> CompactRange:
        """Return an independent copy."""
        other = CompactRange()
        other.size = self.size
        other.last_leaf = self.last_leaf
        other._nodes = list(self._nodes)
        return other

    def append(self, leaf: bytes) -> None:
        """Add one leaf hash (32 bytes)."""
        self.last_leaf = leaf
        height, value = 0, leaf
        while self._nodes and self._nodes[-1][0] == height:
            _, left = self._nodes.pop()
            value = node_hash(left, value)
            height += 1
        self._nodes.append((height, value))
        self.size += 1

    def root(self) -> bytes:
        """Return the root hash of the leaves appended so far."""
        if not self._nodes:
            return EMPTY_ROOT
        acc = self._nodes[-1][1]
        for _, left in reversed(self._nodes[:-1]):
            acc = node_hash(left, acc)
        return acc


def inclusion_proof(index: int, leaves: Sequence[bytes]) -> list[bytes]:
    """Audit path of leaf ``index`` in the tree of ``leaves`` (RFC 6962 2.1.1 PATH).

    Args:
        index: 0-based leaf index, ``0 <= index < len(leaves)``.
        leaves: All leaf hashes of the tree.

    Returns:
        Sibling hashes from the leaf up to the root.

    Raises:
        ValueError: If ``index`` is out of range.
    """
    if not 0 <= index < len(leaves):
        raise ValueError(f"leaf index {index} out of range for tree size {len(leaves)}")
    return _path(index, leaves)


def _path(m: int, d: Sequence[bytes]) -> list[bytes]:
    n = len(d)
    if n == 1:
        return []
    k = _split(n)
    if m < k:
        return [*_path(m, d[:k]), root(d[k:])]
    return [*_path(m - k, d[k:]), root(d[:k])]


def consistency_proof(old_size: int, leaves: Sequence[bytes]) -> list[bytes]:
    """Consistency proof between sizes ``old_size`` and ``len(leaves)`` (RFC 6962 2.1.2).

    Args:
        old_size: Size of the older tree, ``0 <= old_size <= len(leaves)``.
        leaves: All leaf hashes of the newer tree.

    Returns:
        The proof hashes (empty if ``old_size`` is 0 or equals the new size).

    Raises:
        ValueError: If ``old_size`` is out of range.
    """
    if not 0 <= old_size <= len(leaves):
        raise ValueError(f"old size {old_size} out of range for tree size {len(leaves)}")
    if old_size in (0, len(leaves)):
        return []
    return _subproof(old_size, leaves, True)


def _subproof(m: int, d: Sequence[bytes], complete: bool) -> list[bytes]:
    n = len(d)
    if m == n:
        return [] if complete else [root(d)]
    k = _split(n)
    if m <= k:
        return [*_subproof(m, d[:k], complete), root(d[k:])]
    return [*_subproof(m - k, d[k:], False), root(d[:k])]


def verify_inclusion(
    index: int, size: int, leaf: bytes, proof: Sequence[bytes], expected_root: bytes
) -> None:
    """Verify an inclusion proof (RFC 9162 2.1.3.2).

    Args:
        index: 0-based leaf index.
        size: Tree size the proof is for.
        leaf: The 32-byte leaf hash.
        proof: Audit path as returned by :func:`inclusion_proof`.
        expected_root: Root hash of the tree of ``size`` leaves (e.g. from a checkpoint).

    Raises:
        ProofError: If the proof does not lead to ``expected_root``.
    """
    if not 0 <= index < size:
        raise ProofError(f"leaf index {index} not in a tree of size {size}")
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if len(p) != HASH_SIZE:
            raise ProofError("proof element is not 32 bytes")
        if sn == 0:
            raise ProofError("inclusion proof is too long")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("inclusion proof is too short")
    if r != expected_root:
        raise ProofError("inclusion proof does not lead to the checkpoint root")


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """Verify a consistency proof between two tree heads (RFC 9162 2.1.4.2).

    Args:
        old_size: Size of the older tree.
        new_size: Size of the newer tree (``>= old_size``).
        old_root: Root of the older tree.
        new_root: Root of the newer tree.
        proof: Proof hashes as returned by :func:`consistency_proof`.

    Raises:
        ProofError: If the newer tree does not extend the older one.
    """
    if not 0 <= old_size <= new_size:
        raise ProofError(f"tree shrank from {old_size} to {new_size}")
    if old_size == new_size:
        if proof or old_root != new_root:
            raise ProofError("two different roots for the same tree size")
        return
    if old_size == 0:
        if proof:
            raise ProofError("consistency proof from the empty tree must be empty")
        return
    if not proof:
        raise ProofError("empty consistency proof")
    path = list(proof)
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("consistency proof is too long")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0 or fr != old_root or sr != new_root:
        raise ProofError(f"tree of size {new_size} is not consistent with size {old_size}")
