"""The scan pool: bounded, fair between keys, and a scan stops when its caller gives up
(tester F4: abandoned scans kept burning CPU in the default executor and starved others).

Real threads and a real detector; every wait is on a condition with a bound, never a sleep.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from policy.pii import Detector
from policy.pii.engine import ScanStopped, texts
from policy.pii.pool import ScanPool, ScanRejected

BOUND_S = 10.0


def _blocking(started: threading.Event, release: threading.Event,
              ended: threading.Event | None = None) -> Callable[[Callable[[], bool]], str]:
    """A scan that runs until released or told to stop (polling as the detector does)."""

    def scan(stop: Callable[[], bool]) -> str:
        started.set()
        try:
            while not release.wait(0.001):
                if stop():
                    raise ScanStopped
            return "done"
        finally:
            if ended is not None:
                ended.set()

    return scan


def test_a_scan_whose_caller_timed_out_stops() -> None:
    pool = ScanPool(threads=2, queue=4)
    started, release, ended = threading.Event(), threading.Event(), threading.Event()
    with pytest.raises(TimeoutError):
        asyncio.run(pool.run("k", _blocking(started, release, ended), 0.05))
    assert started.is_set()
    assert ended.wait(BOUND_S)  # it stopped on its own: never released
    assert not release.is_set()


def test_a_key_never_holds_every_thread_and_the_next_scan_is_another_keys() -> None:
    pool = ScanPool(threads=2, queue=16)
    release = threading.Event()
    a_started = [threading.Event() for _ in range(3)]
    jobs = [pool.submit("attacker", _blocking(e, release), BOUND_S) for e in a_started]
    assert a_started[0].wait(BOUND_S)
    b_started = threading.Event()
    b = pool.submit("victim", _blocking(b_started, release), BOUND_S)
    assert b_started.wait(BOUND_S)  # the attacker's waiting scans were queued first
    assert not a_started[1].is_set() and not a_started[2].is_set()
    release.set()
    for job in (*jobs, b):
        assert job.future.result(BOUND_S) == "done"


def test_a_full_queue_or_a_keys_full_share_refuses_at_once() -> None:
    pool = ScanPool(threads=1, queue=4)  # a key may hold 1 waiting scan
    release = threading.Event()
    started = threading.Event()
    pool.submit("a", _blocking(started, release), BOUND_S)
    assert started.wait(BOUND_S)
    pool.submit("a", _blocking(threading.Event(), release), BOUND_S)
    with pytest.raises(ScanRejected, match="this key"):
        pool.submit("a", _blocking(threading.Event(), release), BOUND_S)
    for key in ("b", "c", "d"):
        pool.submit(key, _blocking(threading.Event(), release), BOUND_S)
    with pytest.raises(ScanRejected, match="queue is full"):
        pool.submit("e", _blocking(threading.Event(), release), BOUND_S)
    release.set()


def test_a_waiting_scan_whose_caller_gave_up_never_starts() -> None:
    pool = ScanPool(threads=1, queue=4)
    release, first = threading.Event(), threading.Event()
    running = pool.submit("a", _blocking(first, release), BOUND_S)
    assert first.wait(BOUND_S)
    second = threading.Event()
    with pytest.raises(TimeoutError):
        asyncio.run(pool.run("b", _blocking(second, release), 0.01))
    release.set()
    assert running.future.result(BOUND_S) == "done"
    third = threading.Event()
    assert asyncio.run(pool.run("c", _blocking(third, release), BOUND_S)) == "done"
    assert not second.is_set()


def test_the_detector_stops_a_scan_when_told() -> None:
    detector = Detector()
    pad = " ".join(f"user{i}@example{i}.org" for i in range(500))  # 500 matches
    polls: list[int] = []

    def stop_after(n: int) -> Callable[[], bool]:
        def stop() -> bool:
            polls.append(1)
            return len(polls) > n
        return stop

    with pytest.raises(ScanStopped):
        detector.scan({"user": pad}, stop=stop_after(3))
    assert len(polls) == 4  # it stopped at the first poll that said so
    polls.clear()
    assert len(detector.scan({"user": pad}, stop=stop_after(10**9))) == 500
    assert len(polls) > 1000  # polled on every match and context lookup, not only at start
    found: Any = detector.scan("IBAN DE89 3704 0044 0532 0130 00", stop=lambda: False)
    assert [f.entity for f in found] == ["IBAN_CODE"]


def test_a_walk_counts_every_value_and_stops_when_told() -> None:
    """Empty strings, ``null`` and ``[]`` cost the walk one each (a body of millions of them
    is over any limit, not free), and a walk in the pool polls ``stop``."""
    empties: Any = {"a": [""] * 5000, "b": [None] * 5000, "c": [[]] * 5000}
    assert texts(empties, limit=10_000) is None
    assert texts(empties, limit=20_000) is not None
    with pytest.raises(ScanStopped):
        texts(empties, limit=20_000, stop=lambda: True)
    small = texts({"content": "hello"}, limit=100, stop=lambda: True)  # polled every 1024
    assert small is not None and small.chars == len("content") + len("hello")
