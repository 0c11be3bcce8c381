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
estimated from the relayed events; for an upstream failure answered with an error status, 0
or the prompt estimate, see :data:`_NOT_TAKEN_UP`) and frees the concurrency slot, whatever
the outcome.

This module is also where quota outcomes become HTTP headers, for admissions
(:func:`admission_headers`, on every relayed response) and refusals (:func:`refusal_headers`,
on the 429/503 here and on MCP's refusals) alike: the quota core (limiter contract, backends,
errors) reports numbers, the seam renders them. Header names and value formats follow
OpenAI's documented rate-limit headers (platform.openai.com/docs/guides/rate-limits, "Rate
limits in headers"): ``x-ratelimit-limit-requests``, ``x-ratelimit-remaining-requests``,
``x-ratelimit-reset-requests`` and the same with ``-tokens``; reset values are durations in
the Go ``time.Duration`` style that OpenAI sends (``"1s"``, ``"6m0s"``, ``"120ms"``,
``"8.64s"``, ``"1h2m3s"``). ``Retry-After`` is delay-seconds (RFC 9110 section 10.2.3, an
integer, rounded up); ``retry-after-ms`` (read first by the ``openai`` SDK) is milliseconds.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from gateway.errors import GatewayError, InvalidRequest, ServiceUnavailable
from gateway.errors import RateLimited as GatewayRateLimited
from gateway.quotas.errors import (
    InvalidGenerationField,
    QuotaBackendUnavailable,
    QuotaError,
    RateLimited,
)
from gateway.quotas.limiter import Admission, EventSink, LimitKind, WindowState
from gateway.quotas.service import QuotaPlan, QuotaService
from gateway.quotas.settings import QuotaSettings
from gateway.relay.records import Headers, RequestRecord

_log = logging.getLogger(__name__)

#: Outcomes after which the backend did no billable work: the estimate is given back.
_NOTHING_USED = frozenset({"denied", "invalid"})
#: Outcomes of an upstream failure (error status relayed or sent, timeout, broken connection).
_UPSTREAM_FAILED = frozenset({"upstream_error", "timeout"})
#: Error codes of failures where no replica took the request up: it answered busy (429, 503)
#: or was never reached. Such a request is charged nothing; another failure with nothing
#: relayed (a backend 5xx, a first-byte timeout) its prompt estimate: the replica may have
#: read and prefilled the prompt, but no completion token reached the client.
_NOT_TAKEN_UP = frozenset({
    "upstream_429", "upstream_503", "upstream_connect_error", "upstream_connect_timeout",
    "upstream_egress_denied", "redirect_refused", "no_healthy_replica",
})

_PLAN_CACHE_MAX = 10_000


def to_gateway_error(exc: QuotaError) -> GatewayError:
    """Map a quota error to the gateway's error (one OpenAI error shape for all).

    ``RateLimited`` keeps its code (``rate_limit_exceeded`` / ``insufficient_quota`` /
    ``request_too_large``), its ``type`` (the limit: ``requests``, ``tokens``, ...) and its
    headers; the backend's own saturation is reported by the relay with other codes. A count
    field that bounds no generation (``InvalidGenerationField``) is a 400 naming the field.
    """
    err: GatewayError
    if isinstance(exc, InvalidGenerationField):
        return InvalidRequest(exc.message, param=exc.param)
    if isinstance(exc, QuotaBackendUnavailable):
        err = ServiceUnavailable(exc.message, code=exc.code, headers=refusal_headers(exc))
    else:
        err = GatewayRateLimited(exc.message, code=exc.code, headers=refusal_headers(exc))
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
        elif record.outcome in _UPSTREAM_FAILED and record.status >= 400:
            # The upstream attempt failed and the client got an error status: no completion
            # token was relayed (a response that had started keeps its status, 200).
            used = 0 if record.error_code in _NOT_TAKEN_UP else admission.prompt_tokens
        elif record.outcome == "client_disconnect" and not record.stream:
            used = self._abandoned(admission, record)
        else:
            used = None  # no usage reported: keep the estimate
        await self.limiter.finish(
            admission, admission.estimated_tokens if used is None else used)


    def _abandoned(self, admission: Admission, record: RequestRecord) -> int:
        """The charge of a non-streamed request whose client left before the answer: no
        usage came, and no relayed event tells how far the backend got (it is cancelled now).

        Returns:
            ``max(estimate, prompt + min(rate * seconds, bound) * completions)``: the seconds
            since admission less the flow-control queue wait, ``rate`` the
            ``disconnect_tokens_per_s`` setting, ``bound`` the completion's max tokens (or
            ``completion_reserve_cap``).
        """
        rate = self.service.settings.disconnect_tokens_per_s
        if not admission.admitted_at or not rate:
            return admission.estimated_tokens
        waited_s = float((record.flow or {}).get("wait_ms", 0)) / 1000.0
        seconds = max(0.0, time.monotonic() - admission.admitted_at - waited_s)
        per_completion = min(math.ceil(seconds * rate), admission.completion_bound)
        return max(admission.estimated_tokens,
                   admission.prompt_tokens + per_completion * admission.completions)


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


def format_duration(seconds: float) -> str:
    """Format a duration like Go's ``time.Duration.String`` at millisecond precision.

    Args:
        seconds: a duration in seconds (negative values count as 0).

    Returns:
        ``"0s"``, ``"120ms"``, ``"8.64s"``, ``"6m0s"``, ``"1h2m3s"`` ...
    """
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, frac = divmod(rest, 1000)
    sec_text = str(secs) if frac == 0 else f"{secs}.{frac:03d}".rstrip("0")
    if hours:
        return f"{hours}h{minutes}m{sec_text}s"
    if minutes:
        return f"{minutes}m{sec_text}s"
    return f"{sec_text}s"


def window_headers(requests: WindowState | None, tokens: WindowState | None) -> dict[str, str]:
    """Return the ``x-ratelimit-*`` headers for the given per-minute snapshots.

    Args:
        requests: tightest requests-per-minute snapshot, or None when no such limit applies.
        tokens: tightest tokens-per-minute snapshot, or None.

    Returns:
        Header name (lower case) -> value; empty when neither limit applies.
    """
    out: dict[str, str] = {}
    for suffix, state in (("requests", requests), ("tokens", tokens)):
        if state is None:
            continue
        out[f"x-ratelimit-limit-{suffix}"] = str(state.limit)
        out[f"x-ratelimit-remaining-{suffix}"] = str(state.remaining)
        out[f"x-ratelimit-reset-{suffix}"] = format_duration(state.reset_s)
    return out


def admission_headers(admission: Admission) -> dict[str, str]:
    """Return the ``x-ratelimit-*`` headers to add to a successful response."""
    return window_headers(admission.requests, admission.tokens)


def refusal_headers(exc: QuotaError) -> dict[str, str]:
    """Return the HTTP headers of a quota refusal.

    Args:
        exc: the refusal: a :class:`RateLimited` (or subclass), or
            :class:`QuotaBackendUnavailable` (the shared state is down, fail closed).

    Returns:
        Header name (lower case) -> value: ``Retry-After``, ``retry-after-ms`` and
        ``x-ratelimit-*`` for a ``RateLimited`` (see :func:`rate_limited_headers`),
        ``Retry-After: 1`` for an outage of the quota store (usually short), none otherwise.
    """
    if isinstance(exc, RateLimited):
        state = WindowState(exc.limit, exc.remaining, exc.reset_s)
        return rate_limited_headers(exc.kind, state, exc.retry_after_s)
    if isinstance(exc, QuotaBackendUnavailable):
        return {"retry-after": "1"}
    return {}


def rate_limited_headers(
    kind: LimitKind, state: WindowState, retry_after_s: float | None
) -> dict[str, str]:
    """Return the headers of a 429 answer for the limit that refused.

    ``Retry-After`` and ``retry-after-ms`` are present when waiting helps; otherwise
    ``x-should-retry: false`` tells the ``openai`` SDK not to retry (a request larger than the
    limit, or a budget that only resets in hours). The limit that refused is reported in the
    ``x-ratelimit-*`` headers of its kind (requests or tokens); concurrency and budget refusals
    use ``x-ratelimit-*-concurrency`` / ``-tokens-day`` / ``-tokens-month`` names.

    Args:
        kind: The limit that refused.
        state: That limit's configured value, what is left of it, and seconds until it resets.
        retry_after_s: Seconds after which the same request would be admitted; ``None`` when
            retrying cannot help.

    Returns:
        Header name (lower case) -> value.
    """
    suffix = {
        "requests": "requests",
        "tokens": "tokens",
        "concurrency": "concurrency",
        "tokens_per_day": "tokens-day",
        "tokens_per_month": "tokens-month",
    }[kind]
    headers = {
        f"x-ratelimit-limit-{suffix}": str(state.limit),
        f"x-ratelimit-remaining-{suffix}": str(state.remaining),
        f"x-ratelimit-reset-{suffix}": format_duration(state.reset_s),
    }
    retry = retry_after_s
    # openai SDKs honour server delays only up to 60 s (1.x) or 120 s (3.x) and fall back to
    # short backoff retries past that: say "do not retry" instead.
    if retry is None or retry > 60:
        headers["x-should-retry"] = "false"
        if retry is not None:
            headers["retry-after"] = str(math.ceil(retry))
        return headers
    headers["retry-after"] = str(max(1, math.ceil(retry)))
    headers["retry-after-ms"] = str(max(1, math.ceil(retry * 1000)))
    return headers
