"""Garbage-collector pauses while serving: start-up heap frozen, no reference cycle per request."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from gateway.h1.asgi_io import DisconnectWatch
from gateway.serving.runtime_tuning import GC_THRESHOLDS, freeze_startup_heap, gc_state, tune_gc


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    # Servers an earlier test ran in this process (the gateway's own server, in a thread) froze
    # the heap they started with: start from an unfrozen heap.
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)
    gc.enable()


def test_startup_heap_is_frozen_out_of_later_collections(restore_gc: None) -> None:
    long_lived = {"built": "at start-up"}
    assert gc.get_freeze_count() == 0
    state = freeze_startup_heap()
    assert state.frozen > 1000  # modules, classes, functions
    # other threads of the test process (exporters, servers of earlier tests) may free a few
    # frozen objects between the freeze and this read
    assert abs(gc.get_freeze_count() - state.frozen) < 100
    assert not any(o is long_lived for o in gc.get_objects())  # frozen: not in any generation
    # a full collection no longer walks them: generation 2 is (nearly) empty afterwards
    gc.collect()
    assert len(gc.get_objects(2)) < state.frozen // 10


def test_serving_thresholds_make_young_collections_rarer(restore_gc: None) -> None:
    state = tune_gc()
    assert state.thresholds == GC_THRESHOLDS == gc_state().thresholds
    assert state.thresholds[0] > 700  # CPython's default generation-0 threshold


class _Receive:
    """A receive callable that never returns (the client stays connected)."""

    async def __call__(self) -> dict[str, Any]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def test_finished_disconnect_watch_is_freed_without_a_collection() -> None:
    receive = _Receive()
    gone = weakref.ref(receive)

    async def request(receive: _Receive) -> None:
        watch = DisconnectWatch(receive)
        watch.start()
        await asyncio.sleep(0)  # the watcher is now waiting in receive()
        watch.finish()
        await asyncio.sleep(0)  # let the cancellation run
        await asyncio.sleep(0)

    gc.disable()
    try:
        asyncio.run(request(receive))
        del receive
        # Freed by reference counting alone: the cancelled watcher's traceback does not hold a
        # cycle back through the watch (before the fix it did, once per request).
        assert gone() is None
    finally:
        gc.enable()
