"""A replica's ``Retry-After``: parsed strictly, capped, and relayed as delay-seconds.

RFC 9110 section 10.2.3: ``Retry-After = HTTP-date / delay-seconds``, where delay-seconds is
``1*DIGIT`` (a non-negative whole number of seconds) and HTTP-date is one of the three formats
of section 5.6.7, which a recipient must all accept: IMF-fixdate (``Sun, 06 Nov 1994 08:49:37
GMT``), the obsolete RFC 850 form (``Sunday, 06-Nov-94 08:49:37 GMT``) and asctime
(``Sun Nov  6 08:49:37 1994``).

The gateway does not relay the replica's text: anything else (``soon``, ``-5``, ``1.5``,
``inf``, ``nan``, a date in another form) is dropped, and a valid value is capped at
``retries.retry_after_cap_s`` and sent as delay-seconds. A date becomes the seconds from now
(rounded up; a past date is ``0``), so a client whose clock differs from the replica's still
waits the intended time. The same capped value is the replica's cool-down in its pool, so a
replica cannot take itself out of rotation for years with one header.
"""

from __future__ import annotations

import calendar
import datetime
import math
import re
import time
from collections.abc import Callable

__all__ = ["parse_retry_after", "relayed_retry_after"]

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MON = "(" + "|".join(_MONTHS) + ")"
_TIME = r"(\d{2}):(\d{2}):(\d{2})"
# re.ASCII: \d is 0-9 only (RFC 5234 DIGIT), not every Unicode digit ("١٢" is no delay).
_IMF_FIXDATE = re.compile(r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d{2}) " + _MON + r" (\d{4}) "
                          + _TIME + " GMT", re.ASCII)
_RFC850 = re.compile(r"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), "
                     r"(\d{2})-" + _MON + r"-(\d{2}) " + _TIME + " GMT", re.ASCII)
_ASCTIME = re.compile(r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + _MON + r" ([ \d]\d) " + _TIME
                      + r" (\d{4})", re.ASCII)
_DELAY_SECONDS = re.compile(r"\d+", re.ASCII)


def parse_retry_after(value: str | None, *, now: Callable[[], float] = time.time
                      ) -> float | None:
    """The delay a ``Retry-After`` value asks for, in seconds, or ``None`` when it is invalid.

    Args:
        value: The header value (surrounding whitespace is ignored), or ``None`` (absent).
        now: Wall clock, seconds since the epoch (for an HTTP-date).

    Returns:
        Seconds to wait (``>= 0``; a date in the past gives ``0.0``), or ``None`` when the value
        is absent or is neither delay-seconds nor an HTTP-date (RFC 9110 sections 10.2.3,
        5.6.7).
    """
    if value is None:
        return None
    text = value.strip()
    if _DELAY_SECONDS.fullmatch(text):
        return float(int(text))
    when = _http_date(text, now)
    return None if when is None else max(0.0, when - now())


def relayed_retry_after(value: str | None, cap_s: float,
                        *, now: Callable[[], float] = time.time) -> str | None:
    """The ``Retry-After`` to send the client for a replica's value, or ``None`` to send none.

    Args:
        value: The replica's header value, or ``None``.
        cap_s: Longest delay relayed, seconds (``retries.retry_after_cap_s``).
        now: Wall clock, seconds since the epoch.

    Returns:
        Delay-seconds (whole seconds, rounded up, at most ``ceil(cap_s)``), or ``None`` when the
        replica sent none or an invalid one.
    """
    delay_s = parse_retry_after(value, now=now)
    if delay_s is None:
        return None
    return str(math.ceil(min(delay_s, cap_s)))


def _http_date(text: str, now: Callable[[], float]) -> float | None:
    """Seconds since the epoch of an HTTP-date in any of its three formats, else ``None``."""
    if m := _IMF_FIXDATE.fullmatch(text):
        day, mon, year, hh, mm, ss = m.groups()
        return _epoch(int(year), mon, int(day), int(hh), int(mm), int(ss))
    if m := _RFC850.fullmatch(text):
        day, mon, yy, hh, mm, ss = m.groups()
        return _epoch(_rfc850_year(int(yy), now()), mon, int(day), int(hh), int(mm), int(ss))
    if m := _ASCTIME.fullmatch(text):
        mon, day, hh, mm, ss, year = m.groups()
        return _epoch(int(year), mon, int(day.strip()), int(hh), int(mm), int(ss))
    return None


def _rfc850_year(yy: int, now_s: float) -> int:
    """RFC 9110 section 5.6.7: a two-digit year more than 50 years in the future is the most
    recent past year with those digits."""
    this_year = datetime.datetime.fromtimestamp(now_s, datetime.UTC).year
    year = this_year - this_year % 100 + yy
    if year > this_year + 50:
        year -= 100
    return year


def _epoch(year: int, mon: str, day: int, hh: int, mm: int, ss: int) -> float | None:
    if ss > 60:
        return None
    try:  # a leap second (:60) is counted as the next second
        moment = datetime.datetime(year, _MONTHS.index(mon) + 1, day, hh, mm, min(ss, 59))
    except ValueError:
        return None  # 31 Feb, hour 25, ...
    return float(calendar.timegm(moment.timetuple()) + (ss - min(ss, 59)))
