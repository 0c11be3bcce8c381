"""The pending-prefix overlay: routed, not yet stored blocks count as cached on their replica."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.fleet.exact_index import content_keys
from gateway.fleet.kv_events import BlockStored
from gateway.fleet.model_settings import ModelSettings, ReplicaSettings
from gateway.fleet.pending import PendingPrefixes
from gateway.fleet.settings import RoutingSettings
from gateway.routing import Pool, Replica


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class _Stats:
    events: int = 0


class _Feed:
    """A subscriber in sync (what the scorer reads of one)."""

    stats = _Stats()

    def exact(self) -> bool:
        return True


def _pool(n: int, clock: Clock, **routing: Any) -> Pool:
    model = ModelSettings(
        name="m", strategy="prefix_affinity",
        replicas=[ReplicaSettings(url=f"http://10.0.0.{i}:8000") for i in range(n)],
    )
    p = Pool(model, cooldown_s=10.0, clock=clock, routing=RoutingSettings(**routing))
    assert p.affinity is not None
    for i in range(n):
        p.affinity.attach_events(i, _Feed())
    return p


def _prompt(group: int, question: int) -> list[int]:
    """A 480-token system prompt of ``group`` (30 blocks of 16) and a 40-token question."""
    return [group * 10_000 + t for t in range(480)] + [900_000 + question * 100 + t
                                                      for t in range(40)]


def _send(p: Pool, ids: list[int]) -> tuple[Replica, dict[str, Any], Any]:
    """Route a completions prompt of token ids; the request stays in flight (outstanding)."""
    hint = p.route_hint({"prompt": ids}, ())
    assert hint is not None and hint.token_ids == ids
    r = p.pick(hint=hint)
    assert r is not None and hint.explain is not None
    r.outstanding += 1
    return r, hint.explain, hint


def _stored(ids: list[int], size: int = 16) -> BlockStored:
    n = len(ids) // size
    return BlockStored(block_hashes=tuple(range(1, n + 1)), parent_block_hash=None,
                       token_ids=tuple(ids[: n * size]), block_size=size)


def test_two_requests_of_a_new_group_before_any_event_go_to_one_replica() -> None:
    clock = Clock()
    p = _pool(4, clock)
    assert p.affinity is not None
    for k, r in enumerate(p.replicas):  # unequal loads: the load term differs per replica
        r.outstanding = k % 2
    first, why1, _ = _send(p, _prompt(7, 0))
    assert why1["reason"] == "load" and why1["pending_tokens"] == 0
    assert p.affinity.describe(first)["pending_blocks"] == 520 // 16
    second, why2, _ = _send(p, _prompt(7, 1))
    assert second is first
    assert why2["reason"] == "prefix" and why2["cache_state"] == "exact"
    assert why2["pending_tokens"] == why2["cached_tokens"] == 480
    # Without the overlay the second request finds nothing cached and goes by load elsewhere.
    q = _pool(4, Clock(), pending_blocks=0)
    for k, r in enumerate(q.replicas):
        r.outstanding = k % 2
    a, _, _ = _send(q, _prompt(7, 0))
    b, why, _ = _send(q, _prompt(7, 1))
    assert b is not a and why["reason"] == "load" and why["pending_tokens"] == 0


def test_block_stored_confirms_and_the_exact_index_takes_over() -> None:
    p = _pool(2, Clock())
    assert p.affinity is not None
    ids = _prompt(3, 0)
    r, _, _ = _send(p, ids)
    assert p.affinity.pending.size(r.index) == 32
    p.affinity.exact.apply(r.index, [_stored(ids[:480])])  # the system prompt's 30 blocks
    assert p.affinity.pending.size(r.index) == 2  # the question's two blocks still pending
    again, why, _ = _send(p, _prompt(3, 5))
    assert again is r and why["reason"] == "prefix" and why["pending_tokens"] == 0
    assert why["cached_tokens"] == 480


def test_pending_entries_leave_after_the_settle_grace_and_the_age_bound() -> None:
    clock = Clock()
    p = _pool(2, clock, pending_settle_s=0.5, pending_max_age_s=30.0)
    assert p.affinity is not None
    pending = p.affinity.pending

    def held(r: Replica, ids: list[int]) -> int:
        keys = content_keys(ids, 16)
        return sum(1 for k in keys if pending.owners.get(k, 0) & (1 << r.index))

    r, _, hint = _send(p, _prompt(1, 0))
    hint.release()  # its prefill is over; its events may still be on the way
    clock.now += 0.4
    _send(p, _prompt(2, 0))  # each decision sweeps
    assert held(r, _prompt(1, 0)) == 32
    clock.now += 0.2  # past the grace: a BlockStored that never came cannot pin the replica
    _send(p, _prompt(9, 0))
    assert held(r, _prompt(1, 0)) == 0
    # A request that never ends (hung, events lost) is dropped by age.
    hung, _, _ = _send(p, _prompt(4, 0))
    clock.now += 29.0
    _send(p, _prompt(5, 0))
    assert held(hung, _prompt(4, 0)) == 32
    clock.now += 2.0
    _send(p, _prompt(6, 0))
    assert held(hung, _prompt(4, 0)) == 0


def test_the_overlay_keeps_at_most_its_cap_dropping_the_oldest() -> None:
    pending = PendingPrefixes(2, max_blocks=10, max_age_s=30.0, settle_s=0.0)
    first = pending.add(0, list(range(100, 106)), 1.0)
    pending.add(1, list(range(200, 206)), 2.0)  # 12 > 10: the oldest entry goes
    assert first and pending.size(0) == 0 and pending.size(1) == 6
    assert set(pending.owners) == set(range(200, 206))
    # A block pending through two requests stays until both are gone (or it is stored).
    a = pending.add(1, [200, 300], 3.0)
    pending.settle(a)
    pending.sweep(3.0)
    assert pending.owners[200] == 0b10 and 300 not in pending.owners
    pending.confirm(1, 201)
    assert 201 not in pending.owners and pending.size(1) == 5
    pending.sweep(40.0)
    assert not pending and pending.owners == {} and pending.size(1) == 0
