"""Whether a verified evidence pack is acceptable: its result and its age, not just its seal.

A pack whose signature and digests verify proves what was checked and when; it does not prove
that the checks passed, nor that they are recent. ``gateway preflight verify`` therefore
accepts a pack only when (1) it verifies, (2) its signed result is ``pass`` (unless the
operator accepts a FAIL pack with ``--allow-fail``), and (3) its signed ``generated_at`` is
at most ``--max-age`` old (default :data:`DEFAULT_MAX_AGE`; ``--max-age none`` disables the
check) and not in the future beyond :data:`CLOCK_SKEW`.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from gateway.preflight.errors import EvidenceError

__all__ = ["CLOCK_SKEW", "DEFAULT_MAX_AGE", "Acceptance", "judge", "parse_max_age"]

#: How old a pack may be by default.
DEFAULT_MAX_AGE = dt.timedelta(days=30)
#: How far in the future a pack's time may lie (clocks of two hosts differ).
CLOCK_SKEW = dt.timedelta(minutes=5)
_DURATION = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_max_age(text: str) -> dt.timedelta | None:
    """Parse ``--max-age``: ``90s``, ``12h``, ``30d``, ``2w`` (or combined, ``1d12h``), or
    ``none`` for no limit.

    Raises:
        EvidenceError: Anything else (names the accepted forms).
    """
    t = text.strip().lower()
    if t == "none":
        return None
    parts = _DURATION.findall(t)
    if not parts or "".join(n + u for n, u in parts) != t:
        raise EvidenceError(f"--max-age {text!r}: give a duration such as 12h, 30d, 2w, or none")
    return dt.timedelta(seconds=sum(int(n) * _UNITS[u] for n, u in parts))


@dataclass(frozen=True)
class Acceptance:
    """The verdict on a verified pack.

    Attributes:
        result: The signed result (``pass``/``fail``), or None when the statement has none.
        generated_at: The signed time of the run (ISO 8601 UTC), or None.
        age: ``now - generated_at``, or None when there is no readable time.
        refusals: Why the pack is not acceptable (empty when it is).
    """

    result: str | None
    generated_at: str | None
    age: dt.timedelta | None
    refusals: tuple[str, ...]

    @property
    def accepted(self) -> bool:
        """True when nothing refuses the pack."""
        return not self.refusals


def _parse_time(text: str) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def judge(predicate: dict[str, object], *, max_age: dt.timedelta | None = DEFAULT_MAX_AGE,
          allow_fail: bool = False, now: dt.datetime | None = None) -> Acceptance:
    """Judge a verified pack's signed predicate (``result``, ``generated_at``).

    Args:
        predicate: The statement's predicate, as :func:`verify_pack` returns it.
        max_age: Oldest acceptable pack; None: any age.
        allow_fail: Accept a pack whose result is ``fail``.
        now: The current time (default: now, UTC).

    Returns:
        The verdict, with every reason to refuse.
    """
    now = now or dt.datetime.now(dt.UTC)
    result = predicate.get("result")
    result = str(result) if result is not None else None
    stamp = predicate.get("generated_at")
    generated = str(stamp) if stamp is not None else None
    when = _parse_time(generated) if generated else None
    age = now - when if when is not None else None
    refusals: list[str] = []
    if result not in ("pass", "fail"):
        refusals.append(f"the pack states no result ({result!r})")
    elif result == "fail" and not allow_fail:
        refusals.append("the pack's result is FAIL (accept it with --allow-fail)")
    if age is None:
        refusals.append(f"the pack states no readable time ({generated!r})")
    elif age < -CLOCK_SKEW:
        refusals.append(f"the pack is dated in the future ({generated})")
    elif max_age is not None and age > max_age:
        refusals.append(f"the pack is {_days(age)} old, older than --max-age {_days(max_age)} "
                        "(re-run gateway preflight, or give a larger --max-age)")
    return Acceptance(result=result, generated_at=generated, age=age,
                      refusals=tuple(refusals))


def _days(d: dt.timedelta) -> str:
    s = int(d.total_seconds())
    if s >= 86400:
        return f"{s / 86400:.1f} days"
    if s >= 3600:
        return f"{s / 3600:.1f} hours"
    return f"{s} s"
