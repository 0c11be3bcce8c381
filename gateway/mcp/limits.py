"""Quotas and flow control of MCP requests.

Two separate limits, both refused before anything is forwarded, as a JSON-RPC error with an
HTTP status and ``Retry-After``, and audited (``mcp.refused``):

* **The caller's quotas** (``quotas:``; :class:`gateway.quotas.tool_calls.ToolCallQuotas`): a
  message a caller sends (``tools/call``, ``resources/read``, lists, notifications...; a
  refused one too) counts as one request against the key's, team's and organisation's
  ``requests_per_minute``, and a request holds a ``max_concurrent`` slot until its answer has
  ended (:func:`gateway.mcp.endpoint.holds_slot`), the same counters as model requests. Over a
  limit: 429, ``-32003``, reason ``rate_limit_exceeded`` (``insufficient_quota`` when a token
  budget is spent); the quota backend down and failing closed: 503,
  ``quota_backend_unavailable``.
* **Flow control per server** (``mcp.servers[].flow``, :class:`ServerGate`): at most
  ``max_concurrent`` requests are forwarded to one server at a time; the next
  ``max_queued`` wait in arrival order (FIFO) for at most ``queue_timeout_s``; beyond that, or
  after the wait, 503, ``-32003``, reason ``server_busy``, ``Retry-After: 1``. MCP servers are
  often small single-process services; a bounded queue absorbs an agent's burst, and a full
  queue answers at once, which an agent can retry, instead of piling calls up until they time
  out. The gateway's own ``tools/list`` of a server (its catalogue) is not counted.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from gateway.mcp.jsonrpc import McpRefusal
from gateway.quotas import QuotaBackendUnavailable, QuotaError, RateLimited
from gateway.quotas.hook import refusal_headers

if TYPE_CHECKING:
    from gateway.mcp.settings import McpFlowSettings

__all__ = ["LIMITED", "ServerGate", "quota_refusal"]

LIMITED = -32003
"""JSON-RPC error code of the gateway's limits (quota, busy server); HTTP 429 or 503."""


def quota_refusal(exc: QuotaError) -> McpRefusal:
    """The MCP refusal of a quota error (its ``Retry-After`` and ``x-ratelimit-*`` kept)."""
    headers = [(k.lower().encode(), v.encode()) for k, v in refusal_headers(exc).items()]
    data: dict[str, Any] = {"limit": exc.error_type}
    if isinstance(exc, RateLimited) and exc.retry_after_s is not None:
        data["retry_after_s"] = exc.retry_after_s
    status = 503 if isinstance(exc, QuotaBackendUnavailable) else exc.status
    return McpRefusal(status, LIMITED, exc.code, exc.message, data, headers=headers)


class ServerGate:
    """At most ``max_concurrent`` forwards to one server, ``max_queued`` waiting (FIFO).

    Args:
        server: The server's name (for messages).
        settings: The server's ``flow`` settings.
    """

    def __init__(self, server: str, settings: McpFlowSettings) -> None:
        self.server = server
        self.settings = settings
        self._free = settings.max_concurrent
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def in_flight(self) -> int:
        """Requests holding a slot now."""
        return self.settings.max_concurrent - self._free

    @property
    def queued(self) -> int:
        """Requests waiting for a slot now (also read by the metrics scrape, which may run on
        another thread: it counts a snapshot of the queue, never the deque as it changes)."""
        return sum(1 for w in tuple(self._waiters) if not w.done())

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one slot for the body of the ``async with``.

        Raises:
            McpRefusal: 503 ``server_busy`` (the queue is full, or the wait exceeded
                ``queue_timeout_s``).
        """
        await self._acquire()
        try:
            yield
        finally:
            self._release()

    def _busy(self, why: str) -> McpRefusal:
        return McpRefusal(503, LIMITED, "server_busy", f"MCP server {self.server} is busy: {why}",
                          {"retry_after_s": 1}, headers=[(b"retry-after", b"1")])

    async def _acquire(self) -> None:
        if self._free > 0 and not self.queued:
            self._free -= 1
            return
        if self.queued >= self.settings.max_queued:
            raise self._busy(f"{self.settings.max_concurrent} calls in flight and "
                             f"{self.settings.max_queued} waiting")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.settings.queue_timeout_s):
                await waiter
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed a slot while leaving: pass it on
            else:
                waiter.cancel()
            if isinstance(exc, TimeoutError):
                raise self._busy(
                    f"no slot within {self.settings.queue_timeout_s:g} s") from None
            raise

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes straight to the next in line
                return
        self._free = min(self._free + 1, self.settings.max_concurrent)

