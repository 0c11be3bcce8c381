"""Client-chosen strings, bounded before they reach labels, spans, logs and audit records.

A request can carry any text where the gateway expects a name (``model``, the path). Written
verbatim, one 200 KB model name makes a 200 KB audit record, and 200 random names make 200
metric series per instrument. Two rules, used by :mod:`gateway.telemetry` and
:mod:`gateway.audit`:

* metric labels and span names take only configured names; anything else is :data:`OTHER`
  (``_OTHER``, the OpenTelemetry semantic conventions' value for "a value outside the known
  set", as for ``http.request.method``);
* records and logs keep a configured name as is and an unknown one :func:`bounded`: short
  printable text as is, anything else as its first :data:`PREFIX_CHARS` characters escaped,
  its length and a digest (``"<prefix>…[len=<n> sha256=<16 hex>]"``), so equal names stay
  joinable and the record stays small.
"""

from __future__ import annotations

import hashlib
from typing import overload

__all__ = ["OTHER", "PREFIX_CHARS", "bounded"]

OTHER = "_OTHER"
"""Metric label / span value of a client-chosen name that is not configured."""

PREFIX_CHARS = 64
"""Characters of an unknown name kept verbatim (escaped) in records and logs."""


@overload
def bounded(text: str, limit: int = ...) -> str: ...
@overload
def bounded(text: None, limit: int = ...) -> None: ...
def bounded(text: str | None, limit: int = PREFIX_CHARS) -> str | None:
    """``text`` if it is at most ``limit`` printable characters, else a bounded stand-in.

    Args:
        text: A client-chosen string (``None`` passes through).
        limit: Characters kept verbatim (default :data:`PREFIX_CHARS`).

    Returns:
        ``text`` itself, or ``"<escaped prefix>…[len=<characters> sha256=<first 16 hex
        digits of the SHA-256 of its UTF-8 bytes>]"``: at most ``10 * limit + 60``
        characters whatever the input (``unicode_escape`` writes a character in at most 10,
        ``\\UXXXXXXXX``).
    """
    if text is None or (len(text) <= limit and text.isprintable()):
        return text
    raw = text.encode("utf-8", "surrogatepass")
    prefix = text[:limit].encode("unicode_escape").decode("ascii")
    return f"{prefix}…[len={len(text)} sha256={hashlib.sha256(raw).hexdigest()[:16]}]"
