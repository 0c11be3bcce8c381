"""URL paths in the configuration (``health.path``, ``routing.metrics_path``, ...): RFC 3986 syntax.

A configured path is appended to a replica's URL and sent as a request target; a space, a
``#``, a non-ASCII letter or a bare ``%`` in it makes an invalid request (or a different one),
so it is refused when the configuration is loaded, naming the key.

The grammar is RFC 3986 §3.3 ``path-absolute`` as HTTP's ``absolute-path`` (RFC 9110 §4.1)::

    absolute-path = 1*( "/" segment )
    segment       = *pchar
    pchar         = unreserved / pct-encoded / sub-delims / ":" / "@"

No query and no fragment: a path setting is a path.

Which settings are URL paths: every ``str`` field named ``path`` or ending in ``_path`` in any
section (filesystem paths are :class:`pathlib.Path` fields, never ``str``);
:func:`url_path_fields` finds them, so a new ``*_path`` setting is checked without being listed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel

__all__ = ["UrlPath", "check_url_path", "url_path_fields", "url_path_problem"]

_PCHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})"
_ABSOLUTE_PATH = re.compile(rf"(?:/{_PCHAR}*)+")
_ONE_PCHAR = re.compile(_PCHAR)


def url_path_problem(value: str) -> str | None:
    """Why ``value`` is not an RFC 3986 absolute path, or ``None`` when it is one.

    Args:
        value: The configured path (``/health``).

    Returns:
        A one-line reason naming the first offending character and its 0-based position.
    """
    if _ABSOLUTE_PATH.fullmatch(value) is not None:
        return None
    if not value.startswith("/"):
        return "must start with / (it is appended to each replica URL)"
    pos = 0
    while pos < len(value):
        if value[pos] == "/":
            pos += 1
            continue
        match = _ONE_PCHAR.match(value, pos)
        if match is None:
            break
        pos = match.end()
    char = value[pos]
    if char == "%":
        return (f"'%' at position {pos} is not followed by two hex digits (write a literal % "
                f"as %25)")
    if char in "?#":
        return f"{char!r} at position {pos}: a query or fragment is not part of a URL path"
    return (f"{char!r} at position {pos} is not allowed in a URL path (RFC 3986); write it "
            f"percent-encoded as UTF-8 (a space is %20)")


def check_url_path(value: str) -> str:
    """``value`` if it is an RFC 3986 absolute path (the pydantic validator of :data:`UrlPath`).

    Raises:
        ValueError: With :func:`url_path_problem`'s reason.
    """
    problem = url_path_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


UrlPath = Annotated[str, AfterValidator(check_url_path)]
"""A ``str`` setting holding an absolute URL path (``/health``), checked when loaded."""


def url_path_fields(model: BaseModel, key: str = "") -> Iterator[tuple[str, str]]:
    """Every URL-path setting in ``model`` and its sections: ``(dotted key, value)``.

    A URL-path setting is a ``str`` field named ``path`` or ending in ``_path``, at any depth
    (sections, lists of sections, mappings of sections).

    Args:
        model: A settings model (:class:`gateway.config.settings.GatewaySettings`).
        key: The dotted key of ``model`` itself (empty at the top).

    Yields:
        ``("health.path", "/health")``, ... in field order.
    """
    for name in type(model).model_fields:
        value = getattr(model, name)
        where = f"{key}.{name}" if key else name
        if isinstance(value, str):
            if name == "path" or name.endswith("_path"):
                yield where, value
        else:
            yield from _nested(value, where)


def _nested(value: Any, where: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, BaseModel):
        yield from url_path_fields(value, where)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _nested(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _nested(item, f"{where}.{name}")
