"""The KV block cache (:mod:`vllm_sim.kv_cache`): chained block hashes and LRU eviction."""

from __future__ import annotations

from vllm_sim.kv_cache import BlockCache, block_hashes


def test_block_hashes_chain_so_a_block_stands_for_its_prefix() -> None:
    a = block_hashes([f"t{i}" for i in range(40)], 16)
    b = block_hashes(["x"] + [f"t{i}" for i in range(1, 40)], 16)
    assert len(a) == 2  # the 8-token tail is not a full block
    assert a[0] != b[0] and a[1] != b[1]  # same tokens 16..31, different prefix
    assert block_hashes([f"t{i}" for i in range(33)], 16) == a


def test_block_cache_evicts_least_recent_unreferenced_blocks_only() -> None:
    cache = BlockCache(4)
    assert cache.acquire([], 2)
    held = cache.promote([11, 12])
    cache.release(held, 0)  # blocks 11, 12 cached, unreferenced
    assert cache.cached_prefix([11, 12]) == 2 and cache.free == 4
    assert cache.acquire([11], 1)  # reuse 11 (referenced again), allocate 1 anonymous
    assert cache.used == 2
    assert cache.acquire([], 2)  # needs 2: one never-used block plus evicting LRU block 12
    assert cache.cached_prefix([11]) == 1 and cache.cached_prefix([12]) == 0
    assert not cache.acquire([], 1)  # everything referenced: nothing may be evicted
    assert cache.used == 4
