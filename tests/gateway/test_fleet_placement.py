"""Stable-hash placement (gateway.fleet.placement): the same choice in every gateway process.

Every pod computes the session ring and the rendezvous tie-break by itself; they agree only if
the hashes do not depend on the process (Python's ``hash`` of a string is randomised per
process) or on the order a pod lists its tied replicas in.
"""

from __future__ import annotations

import os
import subprocess
import sys

from gateway.fleet.placement import Rendezvous, SessionRing, prefix_anchor, stable_point

URLS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]


def test_points_are_the_same_in_another_process() -> None:
    code = ("from gateway.fleet.placement import stable_point, prefix_anchor; "
            "print(stable_point('user-7'), prefix_anchor([1, 2, 3, 4], 2, 2))")
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60, check=True).stdout.split()
    assert out == [str(stable_point("user-7")), str(prefix_anchor([1, 2, 3, 4], 2, 2))]


def test_anchor_hashes_the_block_after_the_held_prefix() -> None:
    ids = list(range(10))
    assert prefix_anchor(ids, 4, 2) == prefix_anchor([4, 5], 0, 2)
    assert prefix_anchor(ids, 4, 2) != prefix_anchor(ids, 6, 2)
    # The whole prompt held: the last block stands for it.
    assert prefix_anchor(ids, 10, 4) == prefix_anchor([6, 7, 8, 9], 0, 4)
    assert prefix_anchor("abcdef", 2, 2) == prefix_anchor("cd", 0, 2)


def test_rendezvous_ignores_the_order_of_the_tied_and_the_process_cache() -> None:
    picks = set()
    for anchor in range(200):
        one = Rendezvous().pick(URLS, [0, 1, 2, 3], anchor)
        other = Rendezvous().pick(URLS, [3, 1, 0, 2], anchor)
        assert one == other
        picks.add(one)
    assert picks == {0, 1, 2, 3}  # new prefixes spread over the replicas


def test_session_ring_keeps_a_session_until_its_replica_is_at_the_bound() -> None:
    ring = SessionRing(load_factor=1.25)
    idle = [0.0] * 4
    home = ring.pick(URLS, idle, "user-7")
    assert all(SessionRing(1.25).pick(URLS, idle, "user-7") == home for _ in range(3))
    # Bound: ceil(1.25 * (total + 1) / 4); the home replica at it hands the session on.
    busy = [0.0] * 4
    busy[home] = 3.0  # total 3: bound ceil(1.25) = 2, and 3 >= 2
    moved = ring.pick(URLS, busy, "user-7")
    assert moved != home
    assert busy[moved] == 0.0
