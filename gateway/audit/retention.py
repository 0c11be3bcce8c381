"""What the store holds against a declared retention: the oldest record and signs of pruning.

AI Act Art. 26(6) has deployers keep the automatically generated logs for at least six months.
A log younger than the retention is fine (the gateway is new); a log younger than the retention
from which records were deleted is not: something pruned records the operator promised to keep.
:func:`retention_state` reports both so the pre-flight's ``audit.retention`` check can decide.

Pruning shows in the store as (each independent of the signatures, so no key is needed):

* a chain whose first stored record has ``seq > 0`` (its head was deleted);
* a chain listed with no record left but with signed checkpoints;
* a ``chain.started`` record naming a previous chain the store no longer has.

Each sign also dates the deleted records from above: they are older than the chain's first
record left, than its newest checkpoint, or than the successor's ``chain.started`` record.
:attr:`RetentionState.pruned_bounds_us` holds that bound per sign: the deleted records may be
that young, and no younger. The decision uses it, not the store's oldest record (another
replica's old chain says nothing about what was deleted here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.audit.records import parse_body
from gateway.audit.store import Store

__all__ = ["RetentionState", "retention_state"]


@dataclass(frozen=True, slots=True)
class RetentionState:
    """The store's age and the pruning found.

    Attributes:
        oldest_us: Time of the oldest stored record, microseconds since the epoch (None: empty).
        records: Number of stored records.
        pruned: One line per sign of deletion (empty when none).
        pruned_bounds_us: Per line of ``pruned``, the upper bound of the deleted records'
            times, microseconds since the epoch.
    """

    oldest_us: int | None
    records: int
    pruned: list[str] = field(default_factory=list)
    pruned_bounds_us: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """As a JSON object."""
        return {"oldest_us": self.oldest_us, "records": self.records, "pruned": self.pruned,
                "pruned_bounds_us": self.pruned_bounds_us}


async def retention_state(store: Store) -> RetentionState:
    """Read the oldest record of every chain and look for deleted heads or chains.

    Args:
        store: An opened store (read-only is enough).

    Raises:
        AuditUnavailable: The store cannot be read.
        AuditFormatError: A first record is not a valid record body.
    """
    chains = await store.list_chains()
    names = {c.chain for c in chains}
    oldest: int | None = None
    total, pruned, bounds = 0, [], []
    for info in chains:
        total += info.size
        first = await store.read_records(info.chain, 0, 1)
        if not first:
            cps = await store.checkpoints(info.chain)
            if cps:
                pruned.append(f"chain {info.chain}: no record left, but signed checkpoints")
                bounds.append(max(c.ts_us for c in cps))
            continue
        rec = first[0]
        oldest = rec.ts_us if oldest is None else min(oldest, rec.ts_us)
        if rec.seq > 0:
            pruned.append(f"chain {info.chain}: records 0..{rec.seq - 1} deleted")
            bounds.append(rec.ts_us)
            continue
        previous = parse_body(rec.body)["data"].get("previous_chain")
        if isinstance(previous, str) and previous not in names:
            pruned.append(f"chain {info.chain}: its previous chain {previous} is gone")
            bounds.append(rec.ts_us)
    return RetentionState(oldest, total, pruned, bounds)
