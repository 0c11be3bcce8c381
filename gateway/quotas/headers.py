"""The rate-limit response headers: ``x-ratelimit-*``, ``Retry-After``, ``retry-after-ms``.

The windows of an admission and of a refusal are reported in the rate-limit response headers
that OpenAI clients read. Header names and value formats follow OpenAI's documented rate-limit
headers (platform.openai.com/docs/guides/rate-limits, "Rate limits in headers"):
``x-ratelimit-limit-requests``, ``x-ratelimit-remaining-requests``,
``x-ratelimit-reset-requests`` and the same with ``-tokens``; reset values are durations in
the Go ``time.Duration`` style that OpenAI sends (``"1s"``, ``"6m0s"``, ``"120ms"``,
``"8.64s"``, ``"1h2m3s"``). ``Retry-After`` is delay-seconds (RFC 9110 section 10.2.3, an
integer, rounded up); ``retry-after-ms`` (read first by the ``openai`` SDK) is milliseconds.

A leaf module: the limiter (admission headers) and the errors (refusal headers) both import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "LimitKind",
    "WindowState",
    "format_duration",
    "rate_limited_headers",
    "window_headers",
]

LimitKind = Literal["requests", "tokens", "concurrency", "tokens_per_day", "tokens_per_month"]


@dataclass(frozen=True)
class WindowState:
    """A snapshot of one per-minute limit, as reported in ``x-ratelimit-*`` headers.

    Attributes:
        limit: the configured per-minute limit.
        remaining: units left right now (never negative).
        reset_s: seconds until the bucket is full again.
    """

    limit: int
    remaining: int
    reset_s: float


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


def rate_limited_headers(
    kind: LimitKind, state: WindowState, retry_after_s: float | None
) -> dict[str, str]:
    """Return the headers of a 429 answer for ``exc``.

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
