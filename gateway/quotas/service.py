"""QuotaService: the one object the gateway talks to for limits.

It turns a request (key id, team, model, body) into subjects and a token estimate, asks the
configured limiter to admit it, and later settles the real usage and frees the slot::

    quotas = QuotaService.from_settings(settings.quotas, on_event=audit_log.append)
    await quotas.start()
    adm = await quotas.admit(key_id="team-a", team="search", model="llama", body=body,
                             endpoint="/v1/chat/completions")      # RateLimited -> 429
    try:
        ...                                                         # forward
        await quotas.settle(adm, usage_total_tokens)
    finally:
        await quotas.release(adm)
    await quotas.aclose()
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from gateway.quotas.limiter import Admission, EventSink, Limiter, SubjectLimits
from gateway.quotas.memory import MemoryLimiter
from gateway.quotas.settings import QuotaSettings
from gateway.quotas.tokens import TokenEstimate, TokenEstimator

_SUBJECT_CACHE_MAX = 10_000


@dataclass(frozen=True, slots=True)
class QuotaPlan:
    """What admitting a request of one key (and team) involves, fixed by the settings.

    Attributes:
        subjects: The limited subjects, key first, then team (empty: nothing is limited).
        needs_tokens: A token limit or budget applies, so the request's tokens are estimated.
    """

    subjects: tuple[SubjectLimits, ...]
    needs_tokens: bool


class QuotaService:
    """Limits per key and per team in front of one limiter backend.

    Args:
        settings: the ``quotas:`` section.
        limiter: the backend (memory or Redis).
        estimator: the token estimator.
    """

    def __init__(
        self, settings: QuotaSettings, limiter: Limiter, estimator: TokenEstimator
    ) -> None:
        self.settings = settings
        self.limiter = limiter
        self.estimator = estimator
        self._plans: dict[tuple[str, str | None, str | None], QuotaPlan] = {}

    @classmethod
    def from_settings(
        cls,
        settings: QuotaSettings,
        *,
        on_event: EventSink | None = None,
        redis_client: Any = None,
    ) -> QuotaService:
        """Build the service with the backend the settings name.

        Args:
            settings: the ``quotas:`` section.
            on_event: sink for quota backend outage/recovery events (the audit log's append).
            redis_client: an existing ``redis.asyncio.Redis`` to use instead of ``redis_url``.

        Returns:
            A service; call :meth:`start` before use and :meth:`aclose` at shutdown.
        """
        limiter: Limiter
        if settings.backend == "redis":
            from gateway.quotas.redis_backend import RedisLimiter

            limiter = RedisLimiter(
                settings.redis_url,
                key_prefix=settings.key_prefix,
                fail_open=settings.on_backend_error == "fail_open",
                timeout_s=settings.redis_timeout_s,
                lease_s=settings.lease_s,
                on_event=on_event,
                client=redis_client,
            )
        else:
            limiter = MemoryLimiter()
        estimator = TokenEstimator(
            settings.tokenizers,
            message_overhead_tokens=settings.message_overhead_tokens,
            completion_reserve_tokens=settings.completion_reserve_tokens,
            completion_reserve_cap=settings.completion_reserve_cap,
        )
        return cls(settings, limiter, estimator)

    async def start(self) -> None:
        """Load tokenizers and start the backend's background work."""
        self.estimator.load()
        await self.limiter.start()

    async def aclose(self) -> None:
        """Stop the backend."""
        await self.limiter.aclose()

    def reconfigure(self, settings: QuotaSettings) -> None:
        """Use the limits of ``settings`` from the next request on (live reload); counters and
        admissions in flight are kept."""
        self.settings = settings
        self._plans = {}

    def plan(self, key_id: str, team: str | None, org: str | None = None) -> QuotaPlan:
        """Return what admitting a request of ``key_id`` (and ``team``, and the identity's
        organisation ``org``) involves (cached)."""
        cache_key = (key_id, team, org)
        found = self._plans.get(cache_key)
        if found is not None:
            return found
        out: list[SubjectLimits] = []
        key_limits = self.settings.limits_for("key", key_id)
        if not key_limits.unlimited:
            out.append(SubjectLimits(f"key:{key_id}", key_limits))
        if team:
            team_limits = self.settings.limits_for("team", team)
            if not team_limits.unlimited:
                out.append(SubjectLimits(f"team:{team}", team_limits))
        if org:
            org_limits = self.settings.limits_for("org", org)
            if not org_limits.unlimited:
                out.append(SubjectLimits(f"org:{org}", org_limits))
        if len(self._plans) >= _SUBJECT_CACHE_MAX:
            self._plans.clear()
        needs_tokens = any(
            s.limits.tokens_per_minute or s.limits.tokens_per_day or s.limits.tokens_per_month
            for s in out
        )
        result = QuotaPlan(tuple(out), needs_tokens)
        self._plans[cache_key] = result
        return result

    def subjects(self, key_id: str, team: str | None) -> tuple[SubjectLimits, ...]:
        """Return the limited subjects of a request (its key, then its team, if limited)."""
        return self.plan(key_id, team).subjects

    async def estimate(
        self, model: str, body: Mapping[str, Any], endpoint: str | None = None
    ) -> TokenEstimate:
        """Estimate the tokens of a request (see :mod:`gateway.quotas.tokens`).

        Raises:
            InvalidGenerationField: a count field (``n``, ``max_tokens``...) is not a count the
                backend accepts, so the request cannot be bounded (400).
        """
        return await self.estimator.estimate_async(model, body, endpoint, strict=True)

    async def admit(
        self,
        *,
        key_id: str,
        team: str | None,
        model: str,
        body: Mapping[str, Any],
        endpoint: str | None = None,
    ) -> Admission:
        """Estimate and admit one request.

        Raises:
            RateLimited: a limit of the key or team has no room (429).
            QuotaBackendUnavailable: Redis is down and the policy is fail closed (503).
        """
        plan = self.plan(key_id, team)
        if not plan.subjects:
            return Admission(lease_id=uuid.uuid4().hex, subjects=(), estimated_tokens=0)
        return await self.admit_plan(plan, model, body, endpoint)

    async def admit_plan(
        self, plan: QuotaPlan, model: str, body: Mapping[str, Any], endpoint: str | None = None
    ) -> Admission:
        """Admit one request whose :meth:`plan` has subjects (estimating tokens if needed).

        Raises:
            RateLimited: a limit of the key or team has no room (429).
            QuotaBackendUnavailable: Redis is down and the policy is fail closed (503).
            InvalidGenerationField: a count field is not a valid count (400).
        """
        if not plan.needs_tokens:
            return await self.limiter.admit(plan.subjects, 0)
        estimate = await self.estimate(model, body, endpoint)
        admission = await self.limiter.admit(plan.subjects, estimate.total)
        admission.prompt_tokens = estimate.prompt
        admission.completions = estimate.completions
        admission.completion_bound = estimate.completion_bound
        admission.admitted_at = time.monotonic()
        return admission

    async def settle(self, admission: Admission, actual_tokens: int | None) -> None:
        """Correct the charge with the real usage (``None``: keep the estimate)."""
        if not admission.subjects:
            return
        await self.limiter.settle(
            admission, admission.estimated_tokens if actual_tokens is None else actual_tokens
        )

    async def release(self, admission: Admission) -> None:
        """Free the concurrency slot of an admission."""
        if admission.subjects:
            await self.limiter.release(admission)

    async def finish(self, admission: Admission, actual_tokens: int | None) -> None:
        """Settle the real usage (``None``: keep the estimate) and free the slot at once."""
        if admission.subjects:
            await self.limiter.finish(
                admission, admission.estimated_tokens if actual_tokens is None else actual_tokens
            )

    @asynccontextmanager
    async def request(
        self,
        *,
        key_id: str,
        team: str | None,
        model: str,
        body: Mapping[str, Any],
        endpoint: str | None = None,
    ) -> AsyncIterator[Admission]:
        """Admit on entry and release on exit (settle inside with the real usage)."""
        admission = await self.admit(
            key_id=key_id, team=team, model=model, body=body, endpoint=endpoint
        )
        try:
            yield admission
        finally:
            await self.release(admission)
