"""MCP requests against the callers' request quotas (the MCP endpoint's seam to quotas).

Every message a caller sends to ``/mcp/<server>`` that the gateway forwards or refuses (a
``tools/call``, ``resources/read``, ``prompts/get``, a list, a subscription, a notification, a
response to the server's request; docs/mcp.md "Quotas and flow control") is charged as one
request with no tokens to the caller's subjects (its key or identity, its team, its
organisation): it takes one of ``requests_per_minute`` and is refused when a limit has no room
or a token budget is spent. A request that waits for its answer (``hold``) also takes one
``max_concurrent`` slot until that answer has ended; a notification, a client response and a
``subscriptions/listen`` stream take none (they belong to work already admitted, or stay open
as long as the client likes: a slot would let a call wait forever for its client's answer
under ``max_concurrent: 1``). The limits are the ``quotas:`` section's, read through the same
:class:`~gateway.quotas.hook.QuotaHook` as model requests (a live reload's new limits apply to
MCP requests too).
"""

from __future__ import annotations

from gateway.quotas.hook import QuotaHook
from gateway.quotas.limiter import Admission, SubjectLimits

__all__ = ["ToolCallQuotas"]


class ToolCallQuotas:
    """Admits and ends MCP requests under the request quotas of their caller.

    Args:
        hook: The gateway's quota hook (its service and limiter backend).
    """

    def __init__(self, hook: QuotaHook) -> None:
        self._hook = hook

    async def admit(self, key_id: str, team: str | None, org: str | None,
                    hold: bool = True) -> Admission | None:
        """Charge one request (no tokens) to the caller's subjects.

        Args:
            hold: Take a ``max_concurrent`` slot until :meth:`finish` (``False``: the
                concurrency limits neither refuse nor count it).

        Returns:
            The admission to hand to :meth:`finish`, ``None`` when no limit applies.

        Raises:
            gateway.quotas.RateLimited: A limit has no room (or a budget is spent).
            gateway.quotas.QuotaBackendUnavailable: Redis is down and the policy fails closed.
        """
        plan = self._hook.service.plan(key_id, team, org)
        subjects = plan.subjects
        if not hold:
            subjects = tuple(
                SubjectLimits(s.name, s.limits.model_copy(update={"max_concurrent": None}))
                for s in subjects)
        if not subjects:
            return None
        return await self._hook.limiter.admit(subjects, 0)

    async def finish(self, admission: Admission) -> None:
        """Free the request's concurrency slot, if it took one (no tokens used)."""
        await self._hook.limiter.finish(admission, 0)
