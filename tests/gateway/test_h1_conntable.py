"""The eviction policy of :class:`gateway.h1.conntable.ConnectionTable`, step by step.

The server-level behaviour (raw sockets, the openai SDK) is in
``test_connection_cap_eviction.py``; here each choice of the table is checked on its own.
"""

from __future__ import annotations

from gateway.h1.conntable import Admission, ConnectionTable, EvictionCause


class Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.evicted: list[EvictionCause] = []

    def evict(self, cause: EvictionCause) -> None:
        self.evicted.append(cause)

    def __repr__(self) -> str:
        return self.name


def test_the_connection_idle_the_longest_makes_room() -> None:
    table: ConnectionTable[Conn] = ConnectionTable(3)
    a, b, c, d = Conn("a"), Conn("b"), Conn("c"), Conn("d")
    for conn in (a, b, c):
        assert table.admit(conn, "10.0.0.1") is Admission.ADMITTED
    table.busy(a)  # a's request came: a is idle again only after it, the newest idle one
    table.idle(a)
    assert table.admit(d, "10.0.0.1") is Admission.ADMITTED
    assert (a.evicted, b.evicted, c.evicted) == ([], [EvictionCause.CONNECTION_CAP], [])
    assert len(table) == 3 and b not in table and d in table


def test_busy_connections_are_never_chosen_and_a_full_table_refuses() -> None:
    table: ConnectionTable[Conn] = ConnectionTable(2)
    a, b, c = Conn("a"), Conn("b"), Conn("c")
    for conn in (a, b):
        table.admit(conn, "10.0.0.1")
        table.busy(conn)
    assert table.admit(c, "10.0.0.2") is Admission.FULL
    assert (a.evicted, b.evicted, len(table), c in table) == ([], [], 2, False)
    table.remove(a)
    table.remove(a)  # idempotent
    assert table.admit(c, "10.0.0.2") is Admission.ADMITTED and len(table) == 2


def test_a_connection_refused_on_connect_is_not_counted_when_it_lingers() -> None:
    table: ConnectionTable[Conn] = ConnectionTable(1)
    a, b = Conn("a"), Conn("b")
    table.admit(a, None)
    table.busy(a)
    assert table.admit(b, None) is Admission.FULL
    table.idle(b)  # the refused connection lingers: still not counted
    assert (len(table), table.idle_count, b in table) == (1, 0, False)


def test_an_address_over_its_cap_replaces_its_own_idle_connection_or_is_refused() -> None:
    table: ConnectionTable[Conn] = ConnectionTable(10, max_per_address=2)
    other = Conn("other")
    table.admit(other, "10.0.0.9")  # idle the longest of all
    m1, m2, m3, m4 = Conn("m1"), Conn("m2"), Conn("m3"), Conn("m4")
    table.admit(m1, "10.0.0.1")
    table.admit(m2, "10.0.0.1")
    table.busy(m1)
    table.idle(m1)  # m1 served a request: m2 is now that address's idle the longest
    assert table.admit(m3, "10.0.0.1") is Admission.ADMITTED
    assert (m2.evicted, m1.evicted, other.evicted) == ([EvictionCause.ADDRESS_CAP], [], [])
    table.busy(m1)
    table.busy(m3)
    assert table.admit(m4, "10.0.0.1") is Admission.ADDRESS_FULL
    assert table.admit(m4, "10.0.0.2") is Admission.ADMITTED  # another address
    table.remove(m1)  # a closed connection frees its address's share
    assert table.admit(Conn("m5"), "10.0.0.1") is Admission.ADMITTED


def test_connections_that_never_carried_a_request_make_room_first() -> None:
    table: ConnectionTable[Conn] = ConnectionTable(3)
    served, s1, s2 = Conn("served"), Conn("s1"), Conn("s2")
    table.admit(served, "10.0.0.1")
    table.busy(served)
    table.idle(served)  # idle keep-alive, and idle the longest
    table.admit(s1, "10.0.0.2")
    table.admit(s2, "10.0.0.2")
    table.admit(Conn("new"), "10.0.0.3")
    assert (served.evicted, s1.evicted, s2.evicted) == ([], [EvictionCause.CONNECTION_CAP], [])
    table.admit(Conn("new2"), "10.0.0.3")
    assert s2.evicted and not served.evicted


def test_answered_connections_make_room_before_fresh_and_idle_ones() -> None:
    table: ConnectionTable[Conn] = ConnectionTable(3)
    fresh, kept, answered = Conn("fresh"), Conn("kept"), Conn("answered")
    table.admit(fresh, "10.0.0.1")  # idle the longest, never carried a request
    table.admit(kept, "10.0.0.2")
    table.busy(kept)
    table.idle(kept)
    table.admit(answered, "10.0.0.3")
    table.busy(answered)
    table.answered_early(answered)  # answered 401 before its body: waits only to close
    table.admit(Conn("new"), "10.0.0.4")
    assert (answered.evicted, fresh.evicted, kept.evicted) == (
        [EvictionCause.CONNECTION_CAP], [], [])
    assert answered not in table and table.idle_count == 3  # fresh, kept and new


def test_an_answered_connection_whose_body_rest_came_is_idle_again() -> None:
    table: ConnectionTable[Conn] = ConnectionTable(2)
    a, b = Conn("a"), Conn("b")
    table.admit(a, None)
    table.admit(b, None)
    table.busy(a)
    table.answered_early(a)
    table.idle(a)  # the discarded rest of its body came: it waits for its next request
    table.admit(Conn("new"), None)
    assert (a.evicted, b.evicted) == ([], [EvictionCause.CONNECTION_CAP])
    table.remove(a)
    assert len(table) == 1 and not table.answered


def test_an_address_over_its_cap_replaces_its_answered_connection_first() -> None:
    table: ConnectionTable[Conn] = ConnectionTable(10, max_per_address=2)
    fresh, answered = Conn("fresh"), Conn("answered")
    table.admit(fresh, "10.0.0.1")
    table.admit(answered, "10.0.0.1")
    table.busy(answered)
    table.answered_early(answered)
    assert table.admit(Conn("new"), "10.0.0.1") is Admission.ADMITTED
    assert (answered.evicted, fresh.evicted) == ([EvictionCause.ADDRESS_CAP], [])
