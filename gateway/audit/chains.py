"""A chain's id and its link to the previous chain of its replica.

A chain is ``<replica>/<UTC start time>-<random>`` (``<YYYYmmddTHHMMSSZ>``). Its first record
(``chain.started``) names the newest earlier chain of the same replica, with that chain's newest
checkpoint and its last stored record (:func:`previous_link`), so a restart cannot silently drop
the previous chain's tail; :mod:`gateway.audit.verify` checks the link from the other end.
Chains are ordered by the start stamp in their id (inside every hashed record); the unhashed
``started_us`` column only breaks ties within one second.
"""

from __future__ import annotations

import re
import secrets
import time
from typing import Any, Final

from gateway.audit.store import Store, replica_of

CHAIN_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}/[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}")
"""What :func:`new_chain_id` writes: a replica id (``AuditSettings.replica_id``'s pattern),
``/``, the UTC start stamp, ``-`` and 8 lower-case hex digits. Chain ids come back from the
store (and from proof bundles), which whoever can write there controls: one that does not
match is reported, and never printed as it is."""


def is_chain_id(text: object) -> bool:
    """True when ``text`` is a string of the :data:`CHAIN_ID` form (ASCII, no controls)."""
    return isinstance(text, str) and CHAIN_ID.fullmatch(text) is not None


def new_chain_id(replica_id: str) -> str:
    """A fresh chain id of ``replica_id``, stamped with the UTC time now (second resolution)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"{replica_id}/{stamp}-{secrets.token_hex(4)}"


def boot_stamp(chain: str) -> str:
    """The UTC start stamp of a chain id ``<replica>/<YYYYmmddTHHMMSSZ>-<random>``."""
    return chain.split("/", 1)[-1].split("-", 1)[0]


async def previous_link(store: Store, replica_id: str) -> dict[str, Any]:
    """The ``previous_chain``, ``previous_checkpoint`` (``{size, note}``) and
    ``previous_tail`` (``{size, hash}``, hash in hex) fields of a new ``chain.started`` record
    of ``replica_id``: each ``None`` when the store holds no earlier chain (or it has no record
    or checkpoint).

    Raises:
        AuditUnavailable: The store cannot be read.
    """
    # By the chain id (it is inside every hashed record), not the unhashed replica and
    # started_us columns of audit_chains: an edit there must not unlink this restart.
    mine = sorted(
        (c for c in await store.list_chains() if replica_of(c.chain) == replica_id),
        key=lambda c: (boot_stamp(c.chain), c.started_us),
    )
    previous: dict[str, Any] = {
        "previous_chain": None,
        "previous_checkpoint": None,
        "previous_tail": None,
    }
    if mine:
        last = mine[-1]
        previous["previous_chain"] = last.chain
        tail = await store.last_record(last.chain)
        if tail is not None:
            previous["previous_tail"] = {"size": tail.seq + 1, "hash": tail.hash.hex()}
        cps = await store.checkpoints(last.chain)
        if cps:
            previous["previous_checkpoint"] = {"size": cps[-1].size, "note": cps[-1].note}
    return previous
