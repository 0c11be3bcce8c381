"""The gateway seam: quotas as an admission hook plus a request observer.

One :class:`QuotaHook` is both an ``admission`` hook and an ``observer`` of the gateway
(:func:`gateway.assembly.assemble` registers it; by hand)::

    hook = QuotaHook.from_settings(settings.quotas, on_event=audit_log.append)
    app = create_app(settings, admission=[hook], observers=[..., hook])

``admit`` estimates the request's tokens and charges the key and its team (a refusal becomes
the gateway's 429 ``RateLimited`` with ``Retry-After`` and ``x-ratelimit-*`` headers, or 503
when Redis is down and the policy fails closed); ``on_end`` settles the real usage
(``input_tokens + output_tokens`` of the record; for a stream that ended without usage after
relaying content, ``record.usage_estimated``, the prompt estimate plus the completion tokens
estimated from the relayed events) and frees the concurrency slot, whatever the outcome.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from gateway.errors import GatewayError, ServiceUnavailable
from gateway.errors import RateLimited as GatewayRateLimited
from gateway.quotas.errors import QuotaBackendUnavailable, QuotaError
from gateway.quotas.limiter import Admission, EventSink, admission_headers
from gateway.quotas.service import QuotaPlan, QuotaService
from gateway.quotas.settings import QuotaSettings
from gateway.relay.records import Headers, RequestRecord

_log = logging.getLogger(__name__)

#: Outcomes after which the backend did no billable work: the estimate is given back.
_NOTHING_USED = frozenset({"denied", "invalid"})

_PLAN_CACHE_MAX = 10_000


def to_gateway_error(exc: QuotaError) -> GatewayError:
    """Map a quota error to the gateway's error (one OpenAI error shape for all).

    ``RateLimited`` keeps its code (``rate_limit_exceeded`` / ``insufficient_quota`` /
    ``request_too_large``), its ``type`` (the limit: ``requests``, ``tokens``, ...) and its
    headers; the backend's own saturation is reported by the relay with other codes.
    """
    err: GatewayError
    if isinstance(exc, QuotaBackendUnavailable):
        err = ServiceUnavailable(exc.message, code=exc.code, headers=exc.headers())
    else:
        err = GatewayRateLimited(exc.message, code=exc.code, headers=exc.headers())
        err.status = exc.status
    err.type = exc.error_type
    return err


class QuotaHook:
    """Admission hook and observer applying a :class:`QuotaService` to relayed requests.

    The one per-request object of quotas: per request it looks up the key's
    :class:`~gateway.quotas.service.QuotaPlan` (decided once per key and team), asks the
    service's limiter backend to admit (the memory backend does the GCRA arithmetic itself),
    renders the ``x-ratelimit-*`` headers and settles with the backend at the end.

    Args:
        service: the quota service (its limiter is the backend the hook calls).
    """

    def __init__(self, service: QuotaService) -> None:
        self.service = service
        self.limiter = service.limiter
        self._pending: dict[str, Admission] = {}
        self._plans: dict[tuple[str, str | None, str | None], QuotaPlan] = {}

    @classmethod
    def from_settings(
        cls, settings: QuotaSettings | Mapping[str, Any], *, on_event: EventSink | None = None
    ) -> QuotaHook:
        """Build the hook from the ``quotas:`` section (a model or its raw mapping)."""
        qs = (
            settings
            if isinstance(settings, QuotaSettings)
            else QuotaSettings.model_validate(settings)
        )
        return cls(QuotaService.from_settings(qs, on_event=on_event))

    async def startup(self) -> None:
        """Start the service (the app's lifespan calls it once)."""
        await self.service.start()

    async def shutdown(self) -> None:
        """Stop the service."""
        await self.service.aclose()

    def reconfigure(self, settings: QuotaSettings) -> None:
        """Apply new per-key, per-team and default limits (live reload) to new requests.

        The backend, its counters and the requests already admitted are kept; only
        ``defaults``, ``keys`` and ``teams`` of ``settings`` are read (the other fields change
        at a restart only).
        """
        self.service.reconfigure(settings)
        self._plans = {}  # a new request's plan comes from the new limits

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet ended."""
        return len(self._pending)

    async def admit(self, record: RequestRecord, body: Mapping[str, Any]) -> None:
        """Charge the request to its key and team, or refuse it.

        Raises:
            gateway.errors.RateLimited: a limit has no room (429).
            gateway.errors.ServiceUnavailable: Redis is down and the policy fails closed (503).
        """
        identity = record.identity  # gateway.identity: the organisation's shared budget
        key = (record.key_id or "", record.team, identity.get("org") if identity else None)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _PLAN_CACHE_MAX:
                self._plans.clear()
            plan = self._plans[key] = self.service.plan(*key)
        if not plan.subjects:
            return
        try:
            if plan.needs_tokens:
                admission = await self.service.admit_plan(
                    plan, record.canonical_model or record.model or "", body, record.path)
            else:
                admission = await self.limiter.admit(plan.subjects, 0)
        except QuotaError as exc:
            raise to_gateway_error(exc) from exc
        self._pending[record.request_id] = admission

    def on_response_start(self, record: RequestRecord, headers: Headers) -> None:
        """Observer hook: add ``x-ratelimit-*`` to a relayed response of an admitted request.

        The admission (still pending when the response starts) gives the tightest
        requests/tokens-per-minute snapshot, as OpenAI sends on every response. Refusals
        carry their headers already.
        """
        admission = self._pending.get(record.request_id)
        if admission is not None:
            extra = admission_headers(admission)
            headers.extend((k.encode(), v.encode()) for k, v in extra.items())

    async def usage(self, key_id: str, team: str | None,
                    org: str | None = None) -> list[dict[str, Any]]:
        """The limits and the tokens used today and this month of one caller's subjects (its
        key or identity, its team, its organisation): the self-service usage endpoint.

        Returns:
            One entry per limited subject: ``{"subject": "key"|"team"|"org", "limits": {...},
            "tokens_used": {"day", "month"}, "tokens_remaining": {"day", "month"}}``
            (``None`` remaining where there is no budget).

        Raises:
            gateway.errors.ServiceUnavailable: The backend cannot be read.
        """
        out: list[dict[str, Any]] = []
        for subject in self.service.plan(key_id, team, org).subjects:
            try:
                used = await self.limiter.used_tokens(subject.name)
            except QuotaError as exc:
                raise to_gateway_error(exc) from exc
            limits = subject.limits
            out.append({
                "subject": subject.name.split(":", 1)[0],
                "limits": limits.model_dump(),
                "tokens_used": used,
                "tokens_remaining": {
                    "day": (None if limits.tokens_per_day is None
                            else max(0, limits.tokens_per_day - used["day"])),
                    "month": (None if limits.tokens_per_month is None
                              else max(0, limits.tokens_per_month - used["month"])),
                },
            })
        return out

    async def on_start(self, record: RequestRecord) -> None:
        """Nothing to do before forwarding (admission already ran)."""

    async def on_end(self, record: RequestRecord) -> None:
        """Settle the real usage and free the concurrency slot."""
        admission = self._pending.pop(record.request_id, None)
        if admission is None:
            return
        if record.usage_estimated and record.input_tokens is None:
            # Stream ended without usage (client gone, upstream broke off): the prompt
            # estimate plus the completion tokens estimated from the relayed events.
            used: int | None = admission.prompt_tokens + (record.output_tokens or 0)
        elif record.input_tokens is not None or record.output_tokens is not None:
            used = (record.input_tokens or 0) + (record.output_tokens or 0)
        elif record.outcome in _NOTHING_USED:
            used = 0
        else:
            used = None  # no usage reported: keep the estimate
        await self.limiter.finish(
            admission, admission.estimated_tokens if used is None else used)


def quota_hook(
    section: QuotaSettings | Mapping[str, Any] | None, *, on_event: EventSink | None = None
) -> QuotaHook | None:
    """The hook for the gateway's ``quotas:`` section, or None when absent or disabled.

    Args:
        section: ``settings.quotas`` (raw mapping or model).
        on_event: sink for quota backend outage/recovery events (the audit log's ``append``).

    Raises:
        pydantic.ValidationError: the section is invalid (the message names the key).
    """
    if section is None:
        return None
    qs = section if isinstance(section, QuotaSettings) else QuotaSettings.model_validate(section)
    if not qs.enabled:
        return None
    return QuotaHook(QuotaService.from_settings(qs, on_event=on_event))
