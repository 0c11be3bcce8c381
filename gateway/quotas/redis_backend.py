"""Redis limiter: limits shared by several gateway replicas.

Every admission is one Lua script (:mod:`gateway.quotas.redis_lua`) that checks and charges
all limits of all subjects atomically, so N replicas together admit exactly what one would:
no request is admitted beyond a requests-per-minute limit, and the only overshoot of a token
limit comes from completions that use more tokens than were reserved (corrected afterwards,
which delays later requests). Concurrency slots are leases that this replica renews every
``lease_s / 3``; the slots of a crashed replica expire after ``lease_s``.

When Redis cannot be reached the configured policy applies: ``fail_closed`` raises
:class:`QuotaBackendUnavailable` (503) and admits nothing; ``fail_open`` admits the request
unaccounted (``Admission.fail_open``). Both the outage and the recovery (with the number of
requests admitted or refused meanwhile) are sent to the event sink (the audit log) as
``{"type": "quota.backend_unavailable", "policy", "error"}`` and
``{"type": "quota.backend_recovered", "policy", "outage_ms", "admitted_unaccounted",
"refused"}`` (integers only, as the audit log requires).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Sequence
from typing import Any

import redis.asyncio as redis_async
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.quotas import redis_lua
from gateway.quotas.errors import (
    UNREACHABLE,
    BudgetExhausted,
    QuotaBackendUnavailable,
    RateLimited,
    RequestTooLarge,
    pick_denial,
)
from gateway.quotas.limiter import Admission, EventSink, SubjectLimits, WindowState
from gateway.quotas.memory import PeriodCache, Periods, tightest
from gateway.quotas.redis_batch import ScriptBatcher

_log = logging.getLogger(__name__)

_KINDS = ("requests", "tokens", "concurrency", "tokens_per_day", "tokens_per_month")
#: Errors that mean "Redis is unreachable" (as opposed to a bug in a script).
BACKEND_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    asyncio.TimeoutError,
)


class RedisLimiter:
    """Limits kept in Redis, shared by every replica using the same URL and prefix.

    Args:
        url: Redis URL (``redis://host:port/db``).
        key_prefix: prefix of every key written.
        fail_open: admit unaccounted instead of refusing with 503 when Redis is down.
        timeout_s: socket connect and read timeout per call, in seconds.
        lease_s: lifetime of a concurrency lease unless renewed, in seconds.
        on_event: receives ``quota.backend_unavailable`` / ``quota.backend_recovered`` events.
        client: an existing ``redis.asyncio.Redis`` (then ``url`` and ``timeout_s`` are unused
            and the caller closes it).
        clock: wall clock (Unix seconds) used only for the UTC budget periods.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        key_prefix: str = "sg:q:",
        fail_open: bool = False,
        timeout_s: float = 0.5,
        lease_s: float = 60.0,
        on_event: EventSink | None = None,
        client: redis_async.Redis | None = None,
        clock: Any = time.time,
    ) -> None:
        self._owns_client = client is None
        self._redis: redis_async.Redis = client or redis_async.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # One immediate retry replaces a pooled connection that died with a restarted
            # server; longer retry loops would hold requests during an outage.
            retry=Retry(NoBackoff(), 1),
        )
        self._prefix = key_prefix
        self._fail_open = fail_open
        self._lease_us = int(lease_s * 1_000_000)
        self._lease_s = lease_s
        self._on_event = on_event
        self._clock = clock
        self._periods = PeriodCache()
        self._batch = ScriptBatcher(
            self._redis,
            {
                "admit": redis_lua.ADMIT,
                "settle": redis_lua.SETTLE,
                "release": redis_lua.RELEASE,
                "renew": redis_lua.RENEW,
                "finish": redis_lua.FINISH,
            },
        )
        self._leases: dict[str, list[str]] = {}
        self._renewer: asyncio.Task[None] | None = None
        self._healthy = True
        self._outage_started = 0.0
        self._outage_admitted = 0
        self._outage_refused = 0

    @property
    def healthy(self) -> bool:
        """False while the last Redis call failed."""
        return self._healthy

    def key(self, kind: str, subject: str, period: str = "") -> str:
        """Return the Redis key of one piece of state (``r``, ``t``, ``c``, ``d``, ``m``)."""
        suffix = f":{period}" if period else ""
        return f"{self._prefix}{kind}:{subject}{suffix}"

    async def start(self) -> None:
        """Start the lease renewal task (idempotent)."""
        if self._renewer is None:
            self._renewer = asyncio.create_task(self._renew_loop(), name="quota-lease-renewal")

    async def aclose(self) -> None:
        """Stop renewing leases and close the client if we created it."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None
        if self._owns_client:
            await self._redis.aclose()

    async def used_tokens(self, subject: str) -> dict[str, int]:
        """Tokens charged to ``subject`` in the current UTC day and month (two GETs).

        Raises:
            QuotaBackendUnavailable: Redis cannot be reached.
        """
        periods = self._periods.at(self._clock())
        try:
            day, month = await self._redis.mget(
                self.key("d", subject, periods.day), self.key("m", subject, periods.month))
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            _log.error("quota backend unreachable reading usage: %s", exc)
            raise QuotaBackendUnavailable(UNREACHABLE) from exc
        return {"day": int(day or 0), "month": int(month or 0)}

    async def admit(self, subjects: Sequence[SubjectLimits], estimated_tokens: int) -> Admission:
        """Admit one request against every subject or raise (see ``Limiter.admit``)."""
        cost = max(0, int(estimated_tokens))
        periods = self._periods.at(self._clock())
        lease_id = uuid.uuid4().hex
        keys, args = self._admit_call(subjects, periods)
        argv: list[Any] = [
            cost,
            lease_id,
            self._lease_us,
            math.ceil(periods.day_reset_s) + 86400,
            math.ceil(periods.month_reset_s) + 86400,
            int(periods.day_reset_s * 1_000_000),
            int(periods.month_reset_s * 1_000_000),
            len(subjects),
            *args,
        ]
        try:
            reply = await self._batch.call("admit", keys, argv)
        except BACKEND_ERRORS as exc:
            return await self._backend_down(exc, subjects, cost, lease_id)
        await self._backend_up()
        values = [int(v) for v in reply]
        if values[0] == 0:
            raise pick_denial(_denials(values[1:], subjects))
        conc_keys = [self.key("c", s.name) for s in subjects if s.limits.max_concurrent is not None]
        if conc_keys:
            self._leases[lease_id] = conc_keys
        req: list[WindowState] = []
        tok: list[WindowState] = []
        for i, subject in enumerate(subjects):
            r_rem, r_reset, t_rem, t_reset = values[1 + 4 * i : 5 + 4 * i]
            lim = subject.limits
            if lim.requests_per_minute is not None:
                req.append(WindowState(lim.requests_per_minute, r_rem, r_reset / 1e6))
            if lim.tokens_per_minute is not None:
                tok.append(WindowState(lim.tokens_per_minute, t_rem, t_reset / 1e6))
        return Admission(
            lease_id=lease_id,
            subjects=tuple(subjects),
            estimated_tokens=cost,
            requests=tightest(req),
            tokens=tightest(tok),
            period_keys={"day": periods.day, "month": periods.month},
        )

    async def settle(self, admission: Admission, actual_tokens: int) -> None:
        """Correct the token charge with the real usage (idempotent, never raises)."""
        if admission.settled:
            return
        admission.settled = True
        delta = max(0, int(actual_tokens)) - admission.estimated_tokens
        if admission.fail_open or delta == 0:
            return
        keys, per_subject = self._settle_keys_args(admission, with_concurrency=False)
        try:
            await self._batch.call("settle", keys, [delta, len(admission.subjects), *per_subject])
        except BACKEND_ERRORS as exc:
            _log.warning("quota settle lost (Redis unreachable): %s", exc)

    async def release(self, admission: Admission) -> None:
        """Free the concurrency leases of an admission (idempotent, never raises)."""
        if admission.released:
            return
        admission.released = True
        conc_keys = self._leases.pop(admission.lease_id, None)
        if not conc_keys:
            return
        try:
            await self._batch.call("release", conc_keys, [admission.lease_id])
        except BACKEND_ERRORS as exc:
            # The lease expires by itself after lease_s once we stop renewing it.
            _log.warning("quota release failed (Redis unreachable), lease will expire: %s", exc)

    async def finish(self, admission: Admission, actual_tokens: int) -> None:
        """``settle`` then ``release`` in one Redis round trip (idempotent, never raises)."""
        if admission.settled or admission.released or admission.fail_open:
            await self.settle(admission, actual_tokens)
            await self.release(admission)
            return
        admission.settled = admission.released = True
        self._leases.pop(admission.lease_id, None)
        delta = max(0, int(actual_tokens)) - admission.estimated_tokens
        keys, per_subject = self._settle_keys_args(admission, with_concurrency=True)
        args: list[Any] = [delta, len(admission.subjects), admission.lease_id, *per_subject]
        try:
            await self._batch.call("finish", keys, args)
        except BACKEND_ERRORS as exc:
            _log.warning("quota settle/release lost (Redis unreachable): %s", exc)

    def _settle_keys_args(
        self, admission: Admission, *, with_concurrency: bool
    ) -> tuple[list[str], list[Any]]:
        """KEYS and the per-subject ARGV of the ``settle``/``finish`` scripts (5 keys, 3-4 args
        per subject, in the order the Lua scripts read them)."""
        keys: list[str] = []
        args: list[Any] = []
        day, month = admission.period_keys["day"], admission.period_keys["month"]
        for s in admission.subjects:
            lim = s.limits
            keys += [
                self.key("r", s.name),
                self.key("t", s.name),
                self.key("c", s.name),
                self.key("d", s.name, day),
                self.key("m", s.name, month),
            ]
            args += [
                lim.tokens_per_minute or 0,
                1 if lim.tokens_per_day else 0,
                1 if lim.tokens_per_month else 0,
            ]
            if with_concurrency:
                args.append(1 if lim.max_concurrent else 0)
        return keys, args

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self._lease_s / 3)
            await self.renew_leases()

    async def renew_leases(self) -> int:
        """Extend every lease this replica holds by ``lease_s``; returns how many were renewed."""
        keys: list[str] = []
        members: list[str] = []
        for lease_id, conc_keys in list(self._leases.items()):
            for key in conc_keys:
                keys.append(key)
                members.append(lease_id)
        if not keys:
            return 0
        try:
            return int(await self._batch.call("renew", keys, [self._lease_us, *members]))
        except BACKEND_ERRORS as exc:
            _log.warning("quota lease renewal failed: %s", exc)
            return 0

    def _admit_call(
        self, subjects: Sequence[SubjectLimits], periods: Periods
    ) -> tuple[list[str], list[int]]:
        keys: list[str] = []
        args: list[int] = []
        for s in subjects:
            lim = s.limits
            keys += [
                self.key("r", s.name),
                self.key("t", s.name),
                self.key("c", s.name),
                self.key("d", s.name, periods.day),
                self.key("m", s.name, periods.month),
            ]
            args += [
                lim.requests_per_minute or 0,
                lim.tokens_per_minute or 0,
                lim.max_concurrent or 0,
                lim.tokens_per_day or 0,
                lim.tokens_per_month or 0,
            ]
        return keys, args

    async def _backend_down(
        self, exc: BaseException, subjects: Sequence[SubjectLimits], cost: int, lease_id: str
    ) -> Admission:
        if self._healthy:
            self._healthy = False
            self._outage_started = time.monotonic()
            self._outage_admitted = self._outage_refused = 0
            _log.error("quota backend unreachable (%s): %s", self._policy, exc)
            await self._emit(
                {
                    "type": "quota.backend_unavailable",
                    "policy": self._policy,
                    "error": f"{type(exc).__name__}: {exc}"[:300],
                }
            )
        if not self._fail_open:
            self._outage_refused += 1
            raise QuotaBackendUnavailable(UNREACHABLE) from exc
        self._outage_admitted += 1
        _log.warning("UNSAFE fail_open: admitting a request without quota accounting")
        return Admission(
            lease_id=lease_id, subjects=tuple(subjects), estimated_tokens=cost, fail_open=True
        )

    async def _backend_up(self) -> None:
        if self._healthy:
            return
        self._healthy = True
        outage_s = time.monotonic() - self._outage_started
        _log.warning("quota backend reachable again after %.1fs", outage_s)
        await self._emit(
            {
                "type": "quota.backend_recovered",
                "policy": self._policy,
                "outage_ms": int(outage_s * 1000),
                "admitted_unaccounted": self._outage_admitted,
                "refused": self._outage_refused,
            }
        )

    @property
    def _policy(self) -> str:
        return "fail_open" if self._fail_open else "fail_closed"

    async def _emit(self, event: dict[str, Any]) -> None:
        if self._on_event is None:
            return
        try:
            await self._on_event(event)
        except Exception:
            _log.exception("could not record quota event %s", event.get("type"))


def _denials(flat: Sequence[int], subjects: Sequence[SubjectLimits]) -> list[RateLimited]:
    out: list[RateLimited] = []
    for j in range(0, len(flat), 8):
        kind_i, subj_i, limit, remaining, reset_us, retry_us, never, requested = flat[j : j + 8]
        kind = _KINDS[kind_i]
        cls: type[RateLimited]
        if never:
            cls = RequestTooLarge
        elif kind in ("tokens_per_day", "tokens_per_month"):
            cls = BudgetExhausted
        else:
            cls = RateLimited
        out.append(
            cls(
                kind=kind,  # type: ignore[arg-type]
                subject=subjects[subj_i].name,
                limit=limit,
                remaining=remaining,
                reset_s=reset_us / 1e6,
                retry_after_s=None if never else retry_us / 1e6,
                requested=requested,
            )
        )
    return out
