"""Tool calls against the callers' request quotas (the MCP endpoint's seam to quotas).

A ``tools/call`` through ``/mcp/<server>`` is charged as one request with no tokens to the
caller's subjects (its key or identity, its team, its organisation): it takes one of
``requests_per_minute`` and one ``max_concurrent`` slot until its answer has ended, and is
refused when a limit has no room or a token budget is spent. The limits are the ``quotas:``
section's, read through the same :class:`~gateway.quotas.hook.QuotaHook` as model requests
(a live reload's new limits apply to tool calls too).
"""

from __future__ import annotations

from gateway.quotas.hook import QuotaHook
from gateway.quotas.limiter import Admission

__all__ = ["ToolCallQuotas"]


class ToolCallQuotas:
    """Admits and ends tool calls under the request quotas of their caller.

    Args:
        hook: The gateway's quota hook (its service and limiter backend).
    """

    def __init__(self, hook: QuotaHook) -> None:
        self._hook = hook

    async def admit(self, key_id: str, team: str | None, org: str | None) -> Admission | None:
        """Charge one request (no tokens) to the caller's subjects.

        Returns:
            The admission to hand to :meth:`finish`, ``None`` when no limit applies.

        Raises:
            gateway.quotas.RateLimited: A limit has no room (or a budget is spent).
            gateway.quotas.QuotaBackendUnavailable: Redis is down and the policy fails closed.
        """
        plan = self._hook.service.plan(key_id, team, org)
        if not plan.subjects:
            return None
        return await self._hook.limiter.admit(plan.subjects, 0)

    async def finish(self, admission: Admission) -> None:
        """Free the call's concurrency slot (no tokens used)."""
        await self._hook.limiter.finish(admission, 0)
