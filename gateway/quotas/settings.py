"""Quota configuration: the ``quotas:`` section of the gateway config.

Example::

    quotas:
      enabled: true
      backend: redis                  # memory (one replica, default) | redis (several replicas)
      redis_url: redis://127.0.0.1:6379/0
      on_backend_error: fail_closed   # or fail_open (admit and audit while Redis is down)
      defaults:
        key:  {requests_per_minute: 600, tokens_per_minute: 200000, max_concurrent: 32}
        team: {tokens_per_day: 50000000}
      keys:
        batch-job: {requests_per_minute: 60, max_concurrent: 4}
      teams:
        search: {tokens_per_month: 900000000}
      tokenizers:
        llama-3.1-8b: /models/llama-3.1-8b      # directory holding tokenizer.json

Overrides are merged field by field over ``defaults``: a field absent from an override inherits
the default; a field given as ``null`` explicitly means "no limit" for that key or team.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Subject = Literal["key", "team", "org"]


class Limits(BaseModel):
    """The limits of one subject (a key or a team). ``None`` means unlimited.

    Attributes:
        requests_per_minute: requests admitted per rolling minute (GCRA, burst = the limit).
        tokens_per_minute: prompt + completion tokens per rolling minute; prompts are estimated
            before forwarding and corrected with the real usage afterwards.
        max_concurrent: requests in flight at the same time.
        tokens_per_day: token budget per UTC calendar day.
        tokens_per_month: token budget per UTC calendar month.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    max_concurrent: int | None = Field(default=None, ge=1)
    tokens_per_day: int | None = Field(default=None, ge=1)
    tokens_per_month: int | None = Field(default=None, ge=1)

    def over(self, base: Limits) -> Limits:
        """Return ``base`` with the fields explicitly set in ``self`` replaced.

        Args:
            base: the defaults.

        Returns:
            The merged limits (an explicit ``null`` in ``self`` removes the default's limit).
        """
        merged = base.model_dump()
        for name in self.model_fields_set:
            merged[name] = getattr(self, name)
        return Limits(**merged)

    @property
    def unlimited(self) -> bool:
        """True when no limit at all is set."""
        return all(getattr(self, name) is None for name in type(self).model_fields)


class SubjectDefaults(BaseModel):
    """Limits applied to every key, team and organisation unless overridden."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: Limits = Limits()
    team: Limits = Limits()
    org: Limits = Limits()


class QuotaSettings(BaseModel):
    """The frozen ``quotas:`` configuration section.

    Attributes:
        enabled: master switch; when false no limiter is built.
        backend: ``memory`` (state in this process: one replica) or ``redis`` (shared).
        redis_url: ``redis://host:port/db`` (or ``rediss://``, ``unix://``) for ``backend: redis``.
        key_prefix: prefix of every Redis key we write (lets several gateways share one Redis).
        on_backend_error: ``fail_closed`` (503, default) or ``fail_open`` (admit unaccounted,
            audited) when Redis cannot be reached.
        redis_timeout_s: socket connect/read timeout of each Redis call, in seconds.
        lease_s: concurrency slots expire after this many seconds unless the owning replica
            renews them (it does every ``lease_s / 3``), so a crashed replica frees its slots.
        completion_reserve_tokens: tokens reserved for the completion when a request gives no
            ``max_tokens``; corrected with the real usage afterwards.
        completion_reserve_cap: upper bound of the reserve taken from ``max_tokens``.
        disconnect_tokens_per_s: completion tokens per second (and per completion) charged for
            the generation time of a non-streamed request whose client left before the answer
            (no usage): ``max(estimate, prompt + min(rate * seconds since forwarding, max
            tokens or cap) * completions)``; 0 keeps the admission estimate.
        tokenizers: model name -> local directory with ``tokenizer.json`` (never downloaded).
        message_overhead_tokens: per chat message overhead of the approximate estimator.
        defaults: limits for every key and every team.
        keys: per key id overrides.
        teams: per team overrides.
        orgs: per organisation overrides (an identity's ``org``, from the identity rules: a
            budget shared by everyone the rules put in it, across teams).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    backend: Literal["memory", "redis"] = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = Field(default="sg:q:", min_length=1, max_length=64)
    on_backend_error: Literal["fail_closed", "fail_open"] = "fail_closed"
    redis_timeout_s: float = Field(default=0.5, gt=0, le=30)
    lease_s: float = Field(default=60.0, ge=3, le=86400)
    completion_reserve_tokens: int = Field(default=0, ge=0)
    completion_reserve_cap: int = Field(default=1024, ge=0)
    disconnect_tokens_per_s: float = Field(default=50.0, ge=0)
    tokenizers: dict[str, Path] = Field(default_factory=dict)
    message_overhead_tokens: int = Field(default=4, ge=0, le=64)
    defaults: SubjectDefaults = SubjectDefaults()
    keys: dict[str, Limits] = Field(default_factory=dict)
    teams: dict[str, Limits] = Field(default_factory=dict)
    orgs: dict[str, Limits] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_redis_url(self) -> QuotaSettings:
        if self.backend == "redis" and not self.redis_url.startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ValueError(  # "key: problem": reported on quotas.redis_url
                "redis_url: must start with redis://, rediss:// or unix:// "
                f"(got {self.redis_url!r})"
            )
        return self

    def limits_for(self, subject: Subject, name: str) -> Limits:
        """Return the effective limits of one key or team.

        Args:
            subject: ``key``, ``team`` or ``org``.
            name: the key id, the team or the organisation name.

        Returns:
            ``defaults.<subject>`` with the matching override merged over it.
        """
        base = getattr(self.defaults, subject)
        table = {"key": self.keys, "team": self.teams, "org": self.orgs}[subject]
        override = table.get(name)
        return base if override is None else override.over(base)
