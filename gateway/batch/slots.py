"""The batch runner's request slots, shared round-robin between owners, and its retry rule.

``batch.concurrency`` requests of all batches of a pod are in flight at once. A plain semaphore
hands a freed slot to whoever waited first, so an owner with many batches (or with requests
that wait a long time) holds most of the slots while another owner's batch waits behind it.
:class:`FairSlots` hands a freed slot to the owner next in turn among those waiting (each owner
then goes to the back of the line), so one owner's work cannot hold every slot while another's
waits for longer than one request.

:func:`retriable` is the rule for sending a busy answer again: only when the answer says
waiting can help, and not longer than the runner would wait.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict, deque
from typing import Any

__all__ = ["NEVER_RETRY_CODES", "FairSlots", "retriable"]

NEVER_RETRY_CODES = frozenset({"request_too_large", "insufficient_quota"})
"""Error codes of a 429 that no wait can fix: a request larger than a limit, a budget spent
until its period resets (``gateway.quotas.errors``)."""


class FairSlots:
    """``size`` slots shared round-robin between owners (key ids).

    Args:
        size: Slots (``batch.concurrency``), at least 1.
    """

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    async def acquire(self, owner: str) -> None:
        """Wait for a slot for ``owner``; give it back with :meth:`release`.

        Raises:
            asyncio.CancelledError: Cancelled while waiting (no slot is then held).
        """
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(owner, deque()).append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed a slot just as it was cancelled: pass it on
            else:
                queue = self._waiting.get(owner)
                if queue is not None and fut in queue:
                    queue.remove(fut)
                    if not queue:
                        del self._waiting[owner]
            raise

    def release(self) -> None:
        """Give a slot back: to the first waiter of the owner next in turn, else free."""
        while self._waiting:
            owner, queue = self._waiting.popitem(last=False)
            fut = queue.popleft()
            if queue:
                self._waiting[owner] = queue  # its next request waits behind the others
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1


def retriable(status: int, body: bytes, retry_after_s: float | None,
              should_retry: bool | None, max_wait_s: float) -> bool:
    """Whether a batch request's answer is worth sending again after a wait.

    Args:
        status: The answer's HTTP status.
        body: Its body (OpenAI error JSON when the gateway refused).
        retry_after_s: Its ``retry-after-ms``/``Retry-After``, seconds (``None`` without one).
        should_retry: Its ``x-should-retry`` header (``None`` without one).
        max_wait_s: The longest wait before a retry (``batch.retry_max_wait_s``), seconds.

    Returns:
        ``True`` only for a 429 or 503 that does not say it cannot succeed: not
        ``x-should-retry: false``, not a code of :data:`NEVER_RETRY_CODES`, not a
        ``retry-after`` beyond ``max_wait_s`` (waiting less would only be refused again).
    """
    if status not in (429, 503) or should_retry is False:
        return False
    if retry_after_s is not None and retry_after_s > max_wait_s:
        return False
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        return True
    err = parsed.get("error") if isinstance(parsed, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return code not in NEVER_RETRY_CODES
