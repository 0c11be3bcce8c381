"""The rate-limit response headers that OpenAI clients read.

Header names and value formats follow OpenAI's documented rate-limit headers
(platform.openai.com/docs/guides/rate-limits, "Rate limits in headers"):
``x-ratelimit-limit-requests``, ``x-ratelimit-remaining-requests``,
``x-ratelimit-reset-requests`` and the same with ``-tokens``; reset values are durations in
the Go ``time.Duration`` style that OpenAI sends (``"1s"``, ``"6m0s"``, ``"120ms"``,
``"8.64s"``, ``"1h2m3s"``). ``Retry-After`` is delay-seconds (RFC 9110 section 10.2.3, an
integer, rounded up); ``retry-after-ms`` (read first by the ``openai`` SDK) is milliseconds.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.quotas.errors import RateLimited
    from gateway.quotas.limiter import Admission, WindowState


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


def rate_limited_headers(exc: RateLimited) -> dict[str, str]:
    """Return the headers of a 429 answer for ``exc``.

    ``Retry-After`` and ``retry-after-ms`` are present when waiting helps; otherwise
    ``x-should-retry: false`` tells the ``openai`` SDK not to retry (a request larger than the
    limit, or a budget that only resets in hours). The limit that refused is reported in the
    ``x-ratelimit-*`` headers of its kind (requests or tokens); concurrency and budget refusals
    use ``x-ratelimit-*-concurrency`` / ``-tokens-day`` / ``-tokens-month`` names.
    """
    from gateway.quotas.limiter import WindowState

    suffix = {
        "requests": "requests",
        "tokens": "tokens",
        "concurrency": "concurrency",
        "tokens_per_day": "tokens-day",
        "tokens_per_month": "tokens-month",
    }[exc.kind]
    state = WindowState(exc.limit, exc.remaining, exc.reset_s)
    headers = {
        f"x-ratelimit-limit-{suffix}": str(state.limit),
        f"x-ratelimit-remaining-{suffix}": str(state.remaining),
        f"x-ratelimit-reset-{suffix}": format_duration(state.reset_s),
    }
    retry = exc.retry_after_s
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
