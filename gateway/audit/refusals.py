"""Refused connections, counted: one audit record per client and reason per interval.

The HTTP server refuses requests before the app sees them (malformed heads, timeouts, the
connection cap). One record per refusal let a single client write tens of thousands of records
a minute (42,000 in 20 s) into the tamper-evident chain. :class:`RefusalCounter` writes the
first refusal of a (client, status, code) at once (``count: 1``) and counts the next ones of
the same key until the interval ends, then writes one record with their ``count``; at most
:data:`MAX_KEYS` keys are counted at once (past that, refusals are counted under the client
``None``), so neither the chain nor the counter grows with the attack.

The idle connections the server closes to make room for new ones (``http.evicted``) are
counted the same way, per client and (state, cause), with :meth:`RefusalCounter.count`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["INTERVAL_S", "MAX_KEYS", "RefusalCounter"]

INTERVAL_S = 10.0
"""Seconds over which the refusals of one client and reason are counted into one record."""

MAX_KEYS = 4096
"""Most (client, status, code) keys counted at once."""

_Key = tuple[str | None, Hashable]  # (client, what happened)


class RefusalCounter:
    """Counts refusals per client and reason; emits the records to write.

    Args:
        emit: Called with each record's fields (those given to :meth:`count`, e.g.
            ``status``, ``error_code``, ``reason``; then ``client``, ``count``,
            ``interval_ms``); must not block.
        interval_s: The counting interval, in seconds.
    """

    def __init__(self, emit: Callable[[dict[str, Any]], None],
                 interval_s: float = INTERVAL_S) -> None:
        self._emit = emit
        self.interval_s = interval_s
        self._counts: dict[_Key, list[Any]] = {}  # key -> [count since emitted, fields]
        self._timer: asyncio.TimerHandle | None = None

    def add(self, status: int, code: str, reason: str, client: str | None) -> None:
        """One refusal (on the event loop), counted per (client, status, code)."""
        self.count(client, (status, code),
                   {"status": status, "error_code": code, "reason": reason})

    def count(self, client: str | None, kind: Hashable, fields: dict[str, Any]) -> None:
        """One event of ``kind`` from ``client`` (on the event loop).

        Args:
            client: The client (pseudonym), ``None`` when unknown.
            kind: What happened; events are counted per (client, kind).
            fields: The record's own fields (the first event's are written for the key).
        """
        key: _Key = (client, kind)
        entry = self._counts.get(key)
        if entry is not None:
            entry[0] += 1
            return
        if len(self._counts) >= MAX_KEYS:
            key = (None, kind)
            entry = self._counts.get(key)
            if entry is not None:
                entry[0] += 1
                return
        self._counts[key] = [0, fields]
        self._emit(self._record(key, fields, 1))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._tick)

    def _record(self, key: _Key, fields: dict[str, Any], count: int) -> dict[str, Any]:
        return {**fields, "client": key[0], "count": count,
                "interval_ms": round(self.interval_s * 1000)}

    def _tick(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> None:
        """Emit the counts not yet written and start a new interval."""
        counts, self._counts = self._counts, {}
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for key, (count, fields) in counts.items():
            if count:
                self._emit(self._record(key, fields, count))
