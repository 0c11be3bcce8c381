"""Process tuning for serving: the garbage collector settings of ``gateway serve``, in one place.

Why (measured with 512 concurrent streams at 20 ms between tokens): CPython's cyclic
garbage collector stops the whole process while it runs. With the default thresholds
``(700, 10, 10)`` a full (generation 2) collection walked about 160,000 tracked objects, nearly
all of them imported modules, classes, functions and the state built at start-up that live as
long as the process, and froze every open stream for 89-131 ms at a time (500 ms on a loaded
machine). Two settings remove that class of pause:

1. :func:`freeze_startup_heap`, called once the lifespan start-up has finished, moves every
   object alive at that moment into the permanent generation (:func:`gc.freeze`), so no later
   collection walks them again. Objects created per request are still collected as before.
2. :data:`GC_THRESHOLDS` makes young collections rarer (generation 0 after 10,000 net
   allocations instead of 700), and full collections rarer still: CPython additionally runs a
   full collection only when the objects that survived since the last one exceed 25% of the
   long-lived ones (``Modules/gcmodule.c``, ``long_lived_pending``).

The relay hot path avoids creating reference cycles per request (see
``gateway.h1.asgi_io.DisconnectWatch.finish``), so most per-request objects are freed by reference
counting and never reach a collection.

Sources: https://docs.python.org/3/library/gc.html#gc.freeze (call ``gc.freeze()`` after
start-up, before serving); https://devguide.python.org/internals/garbage-collector/.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

__all__ = ["GC_THRESHOLDS", "GcState", "freeze_startup_heap", "gc_state", "tune_gc"]

_log = logging.getLogger(__name__)

GC_THRESHOLDS: tuple[int, int, int] = (10_000, 20, 20)
"""``gc.set_threshold`` values while serving: (generation 0 allocations, generation 0
collections per generation 1 collection, generation 1 collections per full collection)."""


@dataclass(frozen=True, slots=True)
class GcState:
    """The collector settings in effect.

    Attributes:
        thresholds: ``gc.get_threshold()``.
        frozen: Objects in the permanent generation (``gc.get_freeze_count()``).
        enabled: Whether automatic collection is on.
    """

    thresholds: tuple[int, int, int]
    frozen: int
    enabled: bool


def gc_state() -> GcState:
    """The collector settings of this process now."""
    t0, t1, t2 = gc.get_threshold()
    return GcState(thresholds=(t0, t1, t2), frozen=gc.get_freeze_count(), enabled=gc.isenabled())


def tune_gc() -> GcState:
    """Apply :data:`GC_THRESHOLDS` (call once, at the start of ``gateway serve``).

    Returns:
        The settings now in effect.
    """
    gc.set_threshold(*GC_THRESHOLDS)
    return gc_state()


def freeze_startup_heap() -> GcState:
    """Collect once, then move every live object into the permanent generation.

    Call after the application's start-up (lifespan) finished and before requests are served:
    what exists then (modules, settings, routers, connection pools) lives as long as the process
    and need never be walked again. A collection first frees start-up garbage so that it is not
    frozen with the rest.

    Returns:
        The settings now in effect (``frozen`` counts the objects moved).
    """
    gc.collect()
    gc.freeze()
    state = gc_state()
    _log.info("gc: %d start-up objects frozen, thresholds %s", state.frozen, state.thresholds)
    return state
