"""Access logging: one JSON line per request (logger ``gateway.access``), refusals bounded.

Relay requests are logged by :mod:`gateway.relay.pipeline` from their :class:`RequestRecord`; the
other
HTTP endpoints by :class:`AccessLogMiddleware`. Liveness and readiness probes are not logged
(orchestrators call them every few seconds). Never prompts, completions or keys.

A request refused before any principal was known (no credential, an unknown key or token, an
ambiguous ``Authorization``, an unknown path or method on the app's routes) is anyone's to
send: one line each let one keyless client write 44,500 lines in 10 s, filling the disk. So
:class:`AccessLog` writes the first :data:`LINES_PER_CLIENT` such lines per client network
(:func:`gateway.audit.refusals.client_network`: IPv4 /32, IPv6 /64) and interval, and counts
the rest: when the interval ends (and at shutdown) one ``refused_summary`` line per (network,
reason) gives their ``count``. At most :data:`CLIENTS_PER_INTERVAL` networks get lines of their
own per interval; the refusals of any further network fold into one summary line per reason
(``client_network: null``, ``clients``: how many networks). A request with a known principal
keeps its one line, always.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import MutableMapping
from typing import Any

from gateway.audit.refusals import IPV6_PREFIX, MAX_KEYS, MAX_TRACKED, client_network
from gateway.bounded import bounded
from gateway.relay.records import RequestRecord

__all__ = ["CLIENTS_PER_INTERVAL", "INTERVAL_S", "LINES_PER_CLIENT", "REFUSAL_REASON",
           "AccessLog", "AccessLogMiddleware", "log_record"]

_access = logging.getLogger("gateway.access")
_QUIET_PATHS = frozenset({"/healthz", "/readyz"})

INTERVAL_S = 10.0
"""Seconds over which the refusals of one client network are bounded and summarised."""

LINES_PER_CLIENT = 10
"""Refusals of one client network per interval that get a line of their own (the first ones):
enough to see what a misconfigured client sends; the rest are counted in its summary lines."""

CLIENTS_PER_INTERVAL = 16
"""Client networks per interval with lines of their own (as the audit log's counted
refusals: :data:`gateway.audit.refusals.CLIENTS_PER_INTERVAL`); the rest are folded. An
interval so writes at most 16 * (10 + one summary per reason) lines plus one folded summary per
reason, whatever the number of requests or addresses."""

REFUSAL_REASON = "gateway.refusal_reason"
"""ASGI scope key the app's error handlers set on a request refused before any principal was
known (its reason: ``missing_credential``, ``unknown_key``, ``not_found``...), so that
:class:`AccessLogMiddleware` bounds its line."""


class _Folded:
    """The refusals of one reason from networks past :data:`CLIENTS_PER_INTERVAL`."""

    __slots__ = ("clients", "count")

    def __init__(self) -> None:
        self.count = 0
        self.clients: set[str | None] = set()


class AccessLog:
    """Writes the access lines; bounds those of refusals before a principal was known.

    Args:
        interval_s: The interval over which refusals are bounded, seconds.
        lines_per_client: Refusal lines per client network and interval.
        clients_per_interval: Client networks with lines of their own per interval.
        ipv6_prefix: Prefix length (0-128) by which IPv6 clients are one network.
    """

    def __init__(self, interval_s: float = INTERVAL_S, lines_per_client: int = LINES_PER_CLIENT,
                 clients_per_interval: int = CLIENTS_PER_INTERVAL,
                 ipv6_prefix: int = IPV6_PREFIX) -> None:
        self.interval_s = interval_s
        self.lines_per_client = lines_per_client
        self.clients_per_interval = clients_per_interval
        self._ipv6_prefix = ipv6_prefix
        self._lines: dict[str | None, int] = {}  # network -> refusal lines written
        self._counted: dict[tuple[str | None, str], list[Any]] = {}  # -> [count, status]
        self._folded: dict[str, _Folded] = {}  # reason -> the other networks' refusals
        self._timer: asyncio.TimerHandle | None = None

    def request(self, record: RequestRecord) -> None:
        """The access line of a relayed or ``/v1/models`` request (on the event loop).

        A request refused before forwarding with no principal (no ``key_id``, no verified
        identity) is bounded per client network (:meth:`refused`); every other one is written.
        """
        if not _access.isEnabledFor(logging.INFO):
            return
        if (record.key_id is None and record.identity is None and record.attempts == 0
                and record.status >= 400):
            host = None if record.client_addr is None else record.client_addr.rsplit(":", 1)[0]
            reason = record.reason or record.error_code or f"status_{record.status}"
            if not self.refused(host, reason, record.status):
                return
        log_record(record)

    def refused(self, client_host: str | None, reason: str, status: int) -> bool:
        """Count a refusal before any principal was known; whether it gets its own line.

        Args:
            client_host: The peer's address (``None``: unknown).
            reason: Why (``missing_credential``, ``unknown_key``, ``invalid_token``,
                ``ambiguous_credentials``, ``not_found``...); never client-chosen.
            status: The HTTP status sent.

        Returns:
            ``True``: write its line (one of the first :attr:`lines_per_client` of its
            network this interval); ``False``: counted in a summary line written when the
            interval ends.
        """
        network = client_network(client_host, self._ipv6_prefix)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._tick)
        lines = self._lines.get(network)
        if lines is None and len(self._lines) < self.clients_per_interval:
            lines = self._lines[network] = 0
        if lines is None:  # a network past the bound: folded
            folded = self._folded.get(reason)
            if folded is None:
                if len(self._folded) >= MAX_KEYS:
                    return False  # a reason past the memory bound (reasons are ours: never)
                folded = self._folded[reason] = _Folded()
            folded.count += 1
            if len(folded.clients) < MAX_TRACKED:
                folded.clients.add(network)
            return False
        if lines < self.lines_per_client:
            self._lines[network] = lines + 1
            return True
        entry = self._counted.get((network, reason))
        if entry is None:
            if len(self._counted) >= MAX_KEYS:
                return False
            entry = self._counted[(network, reason)] = [0, status]
        entry[0] += 1
        return False

    def _tick(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> None:
        """Write the summary lines of the interval and start a new one (the interval's end,
        and shutdown)."""
        counted, self._counted = self._counted, {}
        folded, self._folded = self._folded, {}
        self._lines = {}
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        interval_ms = round(self.interval_s * 1000)
        for (network, reason), (count, status) in counted.items():
            _summary({"client_network": network, "reason": reason, "status": status,
                      "count": count, "interval_ms": interval_ms})
        for reason, entry in folded.items():
            _summary({"client_network": None, "reason": reason, "count": entry.count,
                      "clients": len(entry.clients), "interval_ms": interval_ms})


def _summary(fields: dict[str, Any]) -> None:
    _access.info("refused_summary", extra={"access": {"event": "refused_summary", **fields}})


def log_record(record: RequestRecord) -> None:
    """Write the access line of a relayed request."""
    if not _access.isEnabledFor(logging.INFO):
        return
    _access.info(
        "request",
        extra={
            "access": {
                "request_id": record.request_id,
                "trace_id": record.trace_id,
                "key_id": record.key_id,
                "method": record.method,
                "path": record.path,
                "model": record.canonical_model or bounded(record.model),
                "backend": record.replica_url,
                "route": record.route,
                "flow": record.flow,
                "attempts": record.attempts,
                "status": record.status,
                "outcome": record.outcome,
                "error_code": record.error_code,
                "reason": record.reason,
                "latency_ms": record.latency_ms,
                "ttft_ms": record.ttft_ms,
                "input_tokens": record.input_tokens,
                "output_tokens": record.output_tokens,
                "usage_estimated": record.usage_estimated,
                "bytes_in": record.bytes_in,
                "bytes_out": record.bytes_out,
            }
        },
    )


class AccessLogMiddleware:
    """Pure-ASGI middleware: ``x-request-id`` and one access line for non-relay endpoints.

    A request the app refused before knowing its caller (its error handler set
    :data:`REFUSAL_REASON` in the scope) is bounded by ``access`` (:meth:`AccessLog.refused`).

    Args:
        app: The wrapped ASGI app.
        log: Write access lines (``x-request-id`` is added either way).
        access: The gateway's :class:`AccessLog` (``None``: a new one).
    """

    def __init__(self, app: Any, log: bool = True, access: AccessLog | None = None) -> None:
        self.app = app
        self.log = log
        self.access = access if access is not None else AccessLog()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in _QUIET_PATHS:
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        request_id = uuid.uuid4().hex
        status = 0

        async def send_wrapper(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []),
                                      (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            if self.log and _access.isEnabledFor(logging.INFO):
                self._line(scope, request_id, status, t0)

    def _line(self, scope: MutableMapping[str, Any], request_id: str, status: int,
              t0: float) -> None:
        reason = scope.get(REFUSAL_REASON)
        if reason is not None:
            client = scope.get("client")
            if not self.access.refused(client[0] if client else None, reason, status):
                return
        _access.info(
            "request",
            extra={
                "access": {
                    "request_id": request_id,
                    "method": scope["method"],
                    "path": bounded(scope["path"]),
                    "status": status,
                    "reason": reason,
                    "latency_ms": round((time.perf_counter() - t0) * 1000.0, 3),
                }
            },
        )
