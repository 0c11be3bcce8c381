"""What a response's final audit record may say the client got (docs/audit.md "What the
client got").

Under the gateway's own HTTP server (:mod:`gateway.h1.server`) the app learns, through two
scope extensions of :mod:`gateway.h1.asgi_io`, whether the client's connection was lost before
the response completed and how many body bytes it had been handed then (``LOST_EXTENSION``),
and whether the server answered the request itself (``REFUSED_EXTENSION``: a chunk size over
``limits.max_body_bytes``). :func:`delivered` is asked just before the final record is built;
:func:`amend_undelivered` after that record's durable wait and the release of the response's
end, when the client may have left in between. Under another ASGI server neither extension
exists: the responder's count stands.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway.h1.asgi_io import LOST_EXTENSION, REFUSED_EXTENSION, Responder
from gateway.relay.records import RequestRecord

__all__ = ["amend_undelivered", "delivered", "lost_now"]

_log = logging.getLogger(__name__)


def lost_now(extensions: Mapping[str, Any]) -> int | None:
    """The server's ``LOST_EXTENSION`` asked now, for the request in progress: ``None`` when
    its response can still reach the client (or the server offers no such extension), else
    the body bytes handed to the client's connection before it was lost."""
    lost_of = extensions.get(LOST_EXTENSION)
    return lost_of()() if lost_of is not None else None


def delivered(record: RequestRecord, out: Responder,
              extensions: Mapping[str, Any]) -> tuple[int, int]:
    """The status and the body bytes the final record states.

    Args:
        record: The request; its outcome becomes ``client_disconnect`` when the client is
            gone and it was ``ok`` (or still ``pending``); another failure is kept.
        out: The responder (its status and the bytes it sent or holds for the end).
        extensions: The request's ``scope["extensions"]``.

    Returns:
        ``(status, bytes)``: the server's own answer when it refused the request; the body
        bytes handed to the client's connection when that is lost; else what ``out`` sent
        and holds (the held end goes out right after the record is durable).
    """
    refused_of = extensions.get(REFUSED_EXTENSION)
    refused = refused_of() if refused_of is not None else None
    if refused is not None:
        return refused[0], refused[2]
    gone = lost_now(extensions)
    if gone is None:
        return out.status, out.bytes_out
    if record.outcome in ("ok", "pending"):
        record.ended("client_disconnect")
    return out.status, min(gone, out.bytes_out)


async def amend_undelivered(
    hooks: tuple[Callable[[RequestRecord, int], Awaitable[None]], ...], record: RequestRecord,
    extensions: Mapping[str, Any],
) -> None:
    """After the final record's durable wait and the release of the end: when the client left
    in between (``LOST_EXTENSION`` now reports fewer bytes than ``record.bytes_out``), tell
    every ``on_undelivered`` hook the bytes it did get (the audit log appends
    ``request.undelivered``: the chain is append-only). A hook that raises is logged.

    Args:
        hooks: The observers' ``on_undelivered`` hooks.
        record: The request as its final record stated it.
        extensions: The request's ``scope["extensions"]``.
    """
    gone = lost_now(extensions)
    if gone is None or gone >= record.bytes_out:
        return
    for hook in hooks:
        try:
            await hook(record, gone)
        except Exception:
            _log.exception("observer on_undelivered failed (request %s)", record.request_id)
