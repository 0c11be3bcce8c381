"""Which resource URIs a caller subscribed to through the gateway (``resources/updated``).

The specification lets a server send ``notifications/resources/updated`` only for what the
client subscribed to: ``resources/subscribe`` (2024-11-05 .. 2025-11-25, per session) or, from
2026-07-28, the ``resourceSubscriptions`` filter of a ``subscriptions/listen`` request (per
stream; the SDK's server delivers them on that request's stream only). The gateway keeps the
same record and relays such a notification only when its URI is covered by it (and the caller
may read it: :mod:`gateway.mcp.withhold`), so a server that sends updates nobody asked for,
or for another caller's subscriptions, cannot reach this caller with them.

* :class:`UriSet`: the URIs of one subscription; ``covers(uri)`` is true for a subscribed URI
  and, as the schema allows ("might be a sub-resource of the one that the client actually
  subscribed to"), for a URI below it (``docs://a`` covers ``docs://a/b``, not ``docs://ab``).
  URIs are compared in normal form (:func:`gateway.mcp.access.uri_forms`).
* :class:`Subscriptions`: the sets of handshake-era sessions, keyed by (key id, server,
  upstream session id): ``resources/subscribe`` adds (when forwarded), ``resources/unsubscribe``
  removes, the session's ``DELETE`` ends them. In-process and bounded: at most
  ``max_sessions`` sessions (the least recently used is forgotten) of at most
  :data:`MAX_URIS` URIs each (the oldest is forgotten). Forgetting fails closed: updates are
  then withheld, never delivered unasked. A session whose requests are spread over several
  workers (``session_key_file`` shared) has its subscriptions in the worker that forwarded the
  ``resources/subscribe``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from gateway.mcp.access import uri_forms

__all__ = ["MAX_URIS", "SessionKey", "Subscriptions", "UriSet", "listen_uris"]

MAX_URIS = 256
"""Most subscribed URIs kept per session (the oldest is forgotten beyond)."""

SessionKey = tuple[str, str, str]
"""(caller key id, server name, upstream session id)."""


def _normal(uri: str) -> str | None:
    forms = uri_forms(uri)
    return None if forms is None else forms[-1]


class UriSet:
    """The URIs of one subscription (insertion-ordered; at most :data:`MAX_URIS`).

    Args:
        uris: The subscribed URIs (a URI :func:`uri_forms` refuses is never kept).
    """

    def __init__(self, uris: Iterable[str] = ()) -> None:
        self._uris: OrderedDict[str, None] = OrderedDict()
        for uri in uris:
            self.add(uri)

    def add(self, uri: str) -> None:
        """Subscribe ``uri`` (forgetting the oldest beyond :data:`MAX_URIS`)."""
        normal = _normal(uri)
        if normal is None:
            return
        self._uris[normal] = None
        self._uris.move_to_end(normal)
        while len(self._uris) > MAX_URIS:
            self._uris.popitem(last=False)

    def remove(self, uri: str) -> None:
        """Unsubscribe ``uri`` (nothing when it was not subscribed)."""
        normal = _normal(uri)
        if normal is not None:
            self._uris.pop(normal, None)

    def covers(self, uri: str) -> bool:
        """Is ``uri`` a subscribed URI or below one (``/`` after it)?"""
        normal = _normal(uri)
        if normal is None:
            return False
        if normal in self._uris:
            return True
        return any(normal.startswith(s if s.endswith("/") else s + "/") for s in self._uris)

    def __len__(self) -> int:
        return len(self._uris)


class Subscriptions:
    """The subscribed URIs of handshake-era sessions (see module docstring).

    Args:
        max_sessions: Most sessions kept (``mcp.limits.max_sessions``).
    """

    def __init__(self, max_sessions: int) -> None:
        self._max = max_sessions
        self._sessions: OrderedDict[SessionKey, UriSet] = OrderedDict()

    def add(self, session: SessionKey, uri: str) -> None:
        """Record a forwarded ``resources/subscribe`` of ``uri`` in ``session``."""
        uris = self._sessions.get(session)
        if uris is None:
            uris = self._sessions[session] = UriSet()
        self._sessions.move_to_end(session)
        uris.add(uri)
        while len(self._sessions) > self._max:
            self._sessions.popitem(last=False)

    def remove(self, session: SessionKey, uri: str) -> None:
        """Record a ``resources/unsubscribe`` of ``uri`` in ``session``."""
        uris = self._sessions.get(session)
        if uris is not None:
            uris.remove(uri)
            if not uris:
                del self._sessions[session]

    def end(self, session: SessionKey) -> None:
        """Forget every subscription of ``session`` (its ``DELETE``)."""
        self._sessions.pop(session, None)

    def covers(self, session: SessionKey | None, uri: str) -> bool:
        """Did ``session`` subscribe to ``uri`` (or a URI above it)? ``None``: no session."""
        uris = self._sessions.get(session) if session is not None else None
        return uris is not None and uris.covers(uri)

    def __len__(self) -> int:
        return len(self._sessions)


def listen_uris(params: Any) -> UriSet:
    """The ``notifications.resourceSubscriptions`` of a ``subscriptions/listen`` request's
    ``params`` (2026-07-28; already judged by :mod:`gateway.mcp.governed`), as a set."""
    wanted = params.get("notifications") if isinstance(params, dict) else None
    uris = wanted.get("resourceSubscriptions") if isinstance(wanted, dict) else None
    return UriSet(u for u in uris if isinstance(u, str)) if isinstance(uris, list) else UriSet()
