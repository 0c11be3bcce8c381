"""The audit log's adapter to the gateway: a request observer with a completion gate.

This is the one module of ``gateway.audit`` that imports the gateway core (its error type and
request record); the rest of the package does not (an import contract checks it), so the CLI
can verify a log offline.

:class:`AuditObserver` (built by :func:`gateway.assembly.assemble`): ``on_start`` makes the
``request.started`` record durable before the gateway forwards a byte, and turns
:class:`AuditUnavailable` into a 503 (``audit_unavailable``) so nothing unaudited is served;
``on_end`` writes ``request.completed`` (or ``request.denied`` for requests refused before
forwarding; a refusal of a caller that established no principal is counted instead, as
``request.refused``, and does not wait for the store: see :meth:`AuditObserver.on_end`).
Its ``end_recorded`` hook makes the responder hold back the end of each response (the last
chunk of a sized body, or the ``data: [DONE]`` event and the end of a stream; earlier stream
events flow at once) until the completion record is durable; if it could not be
written, the end is never sent and the connection is closed, so a client never fully receives
a response whose completion is not in the log; when the client leaves during that wait,
``on_undelivered`` appends ``request.undelivered`` with the bytes it did get.
``startup``/``shutdown`` start and close the chain with the app's lifespan.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from gateway.audit.checkpoint import load_signer
from gateway.audit.errors import AuditError, AuditUnavailable
from gateway.audit.pseudonym import ContentHasher, Pseudonymizer, load_pseudonymizer
from gateway.audit.records import REQUEST_COMPLETED, REQUEST_STARTED
from gateway.audit.refusals import IPV6_PREFIX, RefusalCounter, client_network
from gateway.audit.settings import AuditSettings
from gateway.audit.store import sqlite_file
from gateway.audit.writer import AuditLog, Receipt
from gateway.bounded import bounded
from gateway.config.errors import InvalidConfig, validation_problems
from gateway.errors import ConfigError, ServiceUnavailable
from gateway.relay.records import RequestRecord

_log = logging.getLogger(__name__)

REQUEST_DENIED = "request.denied"
REQUEST_REFUSED = "request.refused"
REQUEST_UNDELIVERED = "request.undelivered"
HTTP_REFUSED = "http.refused"
HTTP_EVICTED = "http.evicted"
MCP_REFUSED = "mcp.refused"
MCP_CATALOGUE = "mcp.catalogue"
CONFIG_LOADED = "config.loaded"

_CLIENT_CACHE_MAX = 10_000
"""Client hosts whose pseudonym is kept (then the cache starts afresh)."""


def _us(ms: float | None) -> int | None:
    return None if ms is None else round(ms * 1000)


class AuditObserver:
    """Writes one started and one completed record per relayed request.

    Args:
        log: The (not yet started) audit log; ``startup`` starts it.
        pseudonymizer: Keyed HMAC for client addresses; ``None`` drops the address.
        config_digest: SHA-256 of the loaded configuration, logged as ``config.loaded``.
        refusal_ipv6_prefix: Prefix length by which counted refusals key IPv6 clients
            (:func:`gateway.audit.refusals.client_network`).
    """

    def __init__(
        self,
        log: AuditLog,
        pseudonymizer: Pseudonymizer | None = None,
        *,
        config_digest: str | None = None,
        refusal_ipv6_prefix: int = IPV6_PREFIX,
    ) -> None:
        self.log = log
        self._pseudo = pseudonymizer
        self._config_digest = config_digest
        self._inflight: set[str] = set()
        self._unrecorded: set[str] = set()
        self._content: dict[str, tuple[str, ContentHasher]] = {}
        self._clients: dict[str, str] = {}  # client host -> pseudonym (the HMAC is fixed)
        self._refusals: set[asyncio.Task[None]] = set()
        self._refusal_counter = RefusalCounter(self._append_refused)
        self._eviction_counter = RefusalCounter(self._append_evicted)
        self._mcp_counter = RefusalCounter(self._append_mcp_refused)
        self._request_counter = RefusalCounter(self._append_request_refused)
        self._catalogue_counter = RefusalCounter(self._append_catalogue)
        self._ipv6_prefix = refusal_ipv6_prefix

    @classmethod
    def from_settings(
        cls, settings: AuditSettings, *, config_digest: str | None = None
    ) -> AuditObserver:
        """Build from the ``audit:`` settings (reads the signing and pseudonym key files).

        Raises:
            AuditConfigError: If a key file is missing or invalid.
        """
        info = {"config_sha256": config_digest} if config_digest else {}
        log = AuditLog.from_settings(settings, start_info=info)
        return cls(
            log, load_pseudonymizer(settings.pseudonym_key_file), config_digest=config_digest,
            refusal_ipv6_prefix=settings.refusal_ipv6_prefix,
        )

    async def startup(self) -> None:
        """Start the chain (raises AuditUnavailable: the gateway then refuses to start)."""
        await self.log.start()
        if self._config_digest:
            await self.log.append({"type": CONFIG_LOADED, "sha256": self._config_digest})

    async def shutdown(self) -> None:
        """Close the chain with a final signed checkpoint (after pending refusal and eviction
        records)."""
        self._refusal_counter.flush()
        self._eviction_counter.flush()
        self._mcp_counter.flush()
        self._request_counter.flush()
        self._catalogue_counter.flush()
        if self._refusals:
            await asyncio.gather(*self._refusals, return_exceptions=True)
        await self.log.close()

    def _client(self, record: RequestRecord) -> str | None:
        if record.client_addr is None:
            return None
        return self._client_host(record.client_addr.rsplit(":", 1)[0])

    def _counted_client(self, host: str | None) -> str | None:
        """The pseudonym of ``host``'s network (IPv6: its /64 by default), for counted
        refusals: one IPv6 network is one client however many addresses it holds."""
        return self._client_host(client_network(host, self._ipv6_prefix))

    def _client_host(self, host: str | None) -> str | None:
        if host is None or self._pseudo is None:
            return None
        pseudonym = self._clients.get(host)
        if pseudonym is None:
            if len(self._clients) >= _CLIENT_CACHE_MAX:
                self._clients.clear()
            pseudonym = self._clients[host] = self._pseudo.pseudonymize(host, "client")
        return pseudonym

    def _request_fields(self, record: RequestRecord) -> dict[str, Any]:
        return {
            "request_id": record.request_id,
            "started_us": int(record.started_at * 1_000_000),
            "method": record.method,
            "path": record.path,
            "client": self._client(record),
            "key_id": record.key_id,
            "team": record.team,
            "data_class": record.data_class,
            # As sent when it named a configured model, else bounded (gateway.bounded):
            # a client's 200 KB name must not make a 200 KB record.
            "model": record.model if record.canonical_model is not None else bounded(record.model),
            "canonical_model": record.canonical_model,
            "served_model": record.served_model,
            "stream": record.stream,
            "destination": record.destination,
            "region": getattr(record, "region", None),
            "policy_rule": record.policy_rule,
            "policy_revision": getattr(record, "policy_revision", None),
            "route": getattr(record, "route", None),
            "flow": getattr(record, "flow", None),
            "pii": getattr(record, "pii", None),
            "bytes_in": record.bytes_in,
            # gateway.identity: who (pseudonymised) and what verified it; keys have none
            **({"identity": record.identity} if record.identity is not None else {}),
            "trace_id": record.trace_id,
        }

    def _end_fields(self, record: RequestRecord) -> dict[str, Any]:
        return {
            "request_id": record.request_id,
            "status": record.status,
            "outcome": record.outcome,
            "error_code": record.error_code,
            "destination": record.destination,
            "replica_url": record.replica_url,
            "attempts": record.attempts,
            "input_tokens": record.input_tokens,
            "output_tokens": record.output_tokens,
            "usage_estimated": record.usage_estimated,
            "latency_us": _us(record.latency_ms),
            "ttft_us": _us(record.ttft_ms),
            "bytes_in": record.bytes_in,
            "bytes_out": record.bytes_out,
            # With pii.responses: record, the response's findings are known only now.
            "pii": getattr(record, "pii", None),
        }

    def content_tap(self, record: RequestRecord, body: bytes) -> Callable[[bytes], None] | None:
        """Policy opt-in (rule ``audit: {content_hmac: true}``): digest the request body.

        Keeps only ``request_content_hmac`` (keyed HMAC of ``body``) and an incremental HMAC
        of the response bytes, fed by the returned tap; never the content. Without a
        pseudonym key there is no HMAC key, so nothing is digested (``None``).
        """
        if self._pseudo is None:
            return None
        hasher = self._pseudo.content_hasher()
        self._content[record.request_id] = (self._pseudo.content_digest(body), hasher)
        return hasher.update

    def _request_content(self, record: RequestRecord) -> dict[str, Any]:
        content = self._content.get(record.request_id)
        return {} if content is None else {"request_content_hmac": content[0]}

    async def on_start(self, record: RequestRecord) -> None:
        """Make ``request.started`` durable; refuse with 503 if the audit store is down."""
        event = {
            "type": REQUEST_STARTED,
            **self._request_fields(record),
            **self._request_content(record),
            "decision": "allow",
        }
        try:
            await self.log.append(event)
        except AuditUnavailable as exc:
            _log.error("audit unavailable, refusing request %s: %s", record.request_id, exc)
            raise ServiceUnavailable(
                "The audit log is unavailable; the request was not forwarded.",
                code="audit_unavailable",
            ) from exc
        self._inflight.add(record.request_id)

    async def on_end(self, record: RequestRecord) -> None:
        """Write ``request.completed`` (forwarded) or ``request.denied`` (refused before).

        A refusal of a caller that established no principal (no credential, an unknown key
        or token, a request refused before its credential was looked at: no ``key_id`` and
        no verified identity) is anyone's to send, so it is counted per client network and
        reason (:class:`gateway.audit.refusals.RefusalCounter`, ``request.refused``) and
        the answer does not wait for the store. Refusals of a known caller (policy, quota,
        model access) keep their own ``request.denied`` record: they are attributable.
        """
        forwarded = record.request_id in self._inflight
        self._inflight.discard(record.request_id)
        content = self._content.pop(record.request_id, None)
        if not forwarded and record.key_id is None and record.identity is None:
            self._count_anonymous(record)
            return
        if forwarded:
            event = {"type": REQUEST_COMPLETED, **self._end_fields(record)}
            if content is not None:
                # Over the body bytes the client received (complete or not: see outcome).
                event["response_content_hmac"] = content[1].digest()
        else:
            decision = "deny" if record.outcome == "denied" else None
            event = {
                "type": REQUEST_DENIED,
                **self._request_fields(record),
                **self._end_fields(record),
                "decision": decision,
            }
            if content is not None:
                event["request_content_hmac"] = content[0]
        try:
            await self.log.append(event)
        except AuditUnavailable as exc:
            if forwarded:
                self._unrecorded.add(record.request_id)
            _log.error("audit record of request %s lost: %s", record.request_id, exc)

    def _count_anonymous(self, record: RequestRecord) -> None:
        path = record.path
        # The route, not the path: a model id in the path is the client's to choose.
        route_class = "/v1/models/{id}" if path.startswith("/v1/models/") else path
        host = None if record.client_addr is None else record.client_addr.rsplit(":", 1)[0]
        self.request_refused(record.status, record.error_code, route_class, host,
                             record.reason)

    def request_refused(self, status: int, code: str | None, route_class: str,
                        client_host: str | None, reason: str | None = None) -> None:
        """Count a request refused before any principal was established (``request.refused``).

        Called by :meth:`on_end` for the relay and ``/v1/models``, and by the app's error
        handler for a 401 on its other routes (``/v1/usage``, the Batch API). Counted per
        client network and (status, code, reason, route class) as :meth:`http_refused` is;
        never waits for the store.

        Args:
            status: HTTP status sent (401, 405, 400...).
            code: The error code sent (``invalid_api_key``, ``token_malformed``...).
            route_class: The route, never a client-chosen id (``/v1/chat/completions``,
                ``/v1/models/{id}``, ``/v1/files/{file_id}``); bounded here.
            client_host: The peer's address, recorded as the pseudonym of its network.
            reason: Why (:attr:`gateway.errors.GatewayError.reason`): ``missing_credential``
                (no bearer credential), ``unknown_key``, ``invalid_token`` (a token or
                ``invalid_certificate``: a client certificate that does not verify),
                ``ambiguous_credentials``; ``None``: the ``code`` says it, and is recorded
                as the reason.
        """
        route_class = bounded(route_class)
        reason = reason or code or "refused"
        fields = {"status": status, "error_code": code, "reason": reason,
                  "route_class": route_class, "decision": "deny"}
        self._request_counter.count(self._counted_client(client_host),
                                    (status, code, reason, route_class), fields)

    async def on_undelivered(self, record: RequestRecord, bytes_out: int) -> None:
        """Append ``request.undelivered``: the client left after ``request.completed`` was
        durable but before the end of the response went out, so that record overstates what
        it got (the chain is append-only: this amends it, linked by ``request_id``).

        Args:
            record: The request (its ``bytes_out``: what ``request.completed`` says).
            bytes_out: Response body bytes the client's connection was handed, bytes.
        """
        event = {"type": REQUEST_UNDELIVERED, "request_id": record.request_id,
                 "outcome": "client_disconnect", "bytes_out": bytes_out,
                 "bytes_recorded": record.bytes_out}
        try:
            await self.log.append(event)
        except AuditUnavailable as exc:
            _log.error("audit record request.undelivered of %s lost: %s",
                       record.request_id, exc)

    def http_refused(self, status: int, code: str, message: str, client_host: str | None) -> None:
        """Record a request the HTTP server refused before the app saw it (``http.refused``).

        The server's ``on_refused`` hook (:mod:`gateway.h1.server`: ambiguous framing,
        malformed or oversized heads, header timeouts, the connection cap). Called on the
        event loop, synchronously: the append runs as a task; a failure is logged (the
        refusal was already sent, nothing was served).

        Args:
            status: HTTP status sent (400, 408, 413, 431, 503).
            code: The error code sent (``invalid_framing``, ...).
            message: The message sent (never the client's bytes).
            client_host: The peer's address, recorded as its HMAC pseudonym.

        Refusals are counted (:class:`gateway.audit.refusals.RefusalCounter`): the first of a
        client and reason is written at once, the next ones of the interval as one record
        with their ``count``.
        """
        self._refusal_counter.add(status, code, message, self._counted_client(client_host))

    def http_evicted(self, state: str, cause: str, client_host: str | None) -> None:
        """Record an idle connection the HTTP server closed to make room (``http.evicted``).

        The server's ``on_evicted`` hook (:mod:`gateway.h1.conntable`): at the connection cap
        (or the per-address cap) a new connection closes the connection idle the longest.
        Counted like refusals: the first of a client, ``state`` and ``cause`` is written at
        once, the next ones of the interval as one record with their ``count``.

        Args:
            state: ``no_request``, ``partial_head``, ``keep_alive`` or ``lingering``.
            cause: ``connection_cap`` or ``address_cap``.
            client_host: The peer's address, recorded as its HMAC pseudonym.
        """
        self._eviction_counter.count(self._counted_client(client_host), (state, cause),
                                     {"state": state, "cause": cause})

    def mcp_refused(self, fields: Mapping[str, Any], client_host: str | None) -> None:
        """Record an MCP request refused before its caller was known (``mcp.refused``).

        The MCP endpoint's hook for refusals anyone can cause (no or a bad credential, an
        unknown server path): counted like :meth:`http_refused`, per client and ``fields``
        (:meth:`gateway.mcp.records.CallRecord.counted_fields`: server, status, reason...;
        the same for every such request), the first written at once, the next ones of the
        interval as one record with their ``count``. No trace id: whoever sends a refused
        request may carry someone else's ``traceparent``.

        Args:
            fields: The record's fields (JSON scalars).
            client_host: The peer's address, recorded as its HMAC pseudonym.
        """
        self._mcp_counter.count(self._counted_client(client_host), tuple(sorted(fields.items())),
                                dict(fields))

    def mcp_catalogue(self, fields: Mapping[str, Any]) -> None:
        """Record a fetch of an MCP server's catalogue by the gateway itself (``mcp.catalogue``).

        :class:`gateway.mcp.catalogue.Catalogue`'s hook: the discovery, ``initialize``,
        ``tools/list`` pages and ``DELETE`` it sent on its own (to check a tool call, to list
        the aggregate endpoint's tools), which no client's record shows. Counted per server and
        outcome as refusals are (:class:`gateway.audit.refusals.RefusalCounter`, ``client``
        ``None``: the gateway): the first of an interval is written at once, the next ones
        (a failing server is asked again on every call; ``catalogue_ttl_s: 0`` refetches
        each time) as one record with their ``count``, its ``duration_us``, ``bytes_out``,
        ``bytes_in`` and ``methods`` the sums over them. Never waits for the store.

        Args:
            fields: ``server``, ``destination``, ``methods`` (requests by method),
                ``outcome``, ``status``, ``modern``, ``tools``, ``duration_us``,
                ``bytes_out``, ``bytes_in`` (:class:`gateway.mcp.catalogue.Catalogue`).
        """
        self._catalogue_counter.count(
            None, (fields.get("server"), fields.get("outcome")), dict(fields),
            totals=("duration_us", "bytes_out", "bytes_in", "methods"))

    def _append_catalogue(self, fields: Mapping[str, Any]) -> None:
        event = {"type": MCP_CATALOGUE, **fields}
        event.pop("client", None)  # the gateway's own requests: no client
        self._append_counted(event)

    def _append_request_refused(self, fields: Mapping[str, Any]) -> None:
        self._append_counted({"type": REQUEST_REFUSED, **fields})

    def _append_mcp_refused(self, fields: Mapping[str, Any]) -> None:
        self._append_counted({"type": MCP_REFUSED, **fields})

    def _append_evicted(self, fields: Mapping[str, Any]) -> None:
        self._append_counted({"type": HTTP_EVICTED, **fields})

    def _append_refused(self, fields: Mapping[str, Any]) -> None:
        self._append_counted({"type": HTTP_REFUSED, **fields})

    def _append_counted(self, event: Mapping[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._append_refusal(event))
        self._refusals.add(task)  # keep a reference until done (asyncio holds tasks weakly)
        task.add_done_callback(self._refusals.discard)

    async def _append_refusal(self, event: Mapping[str, Any]) -> None:
        try:
            await self.log.append(event)
        except AuditError as exc:
            _log.error("audit record %s (%s) lost: %s", event["type"],
                       event.get("status", event.get("state")), exc)

    async def record_event(self, event: Mapping[str, Any]) -> Receipt:
        """Append an admin or security event and wait until it is durable.

        Args:
            event: ``{"type": ..., ...}``, e.g. ``egress.denied`` (destination, host, reason),
                ``policy.loaded`` (sha256, revision), ``key.created`` / ``key.revoked``
                (key_id, team, by). Integers only, never secrets.

        Raises:
            AuditUnavailable: If it could not be recorded.
        """
        return await self.log.append(event)

    def end_recorded(self, record: RequestRecord) -> bool:
        """Observer hook: ``False`` (once) if the completion record could not be written.

        The responder then drops the held-back end of the response.
        """
        if record.request_id in self._unrecorded:
            self._unrecorded.discard(record.request_id)
            return False
        return True


def config_digest(settings_json: str | bytes) -> str:
    """SHA-256 hex of a configuration's serialised form (for ``config.loaded``)."""
    data = settings_json.encode() if isinstance(settings_json, str) else settings_json
    return hashlib.sha256(data).hexdigest()


def build(
    audit_section: AuditSettings | Mapping[str, Any] | None, *, config_digest: str | None = None
) -> AuditObserver | None:
    """The observer for the gateway's ``audit:`` section, or ``None`` when not enabled.

    Raises:
        pydantic.ValidationError: If the section is invalid.
        AuditConfigError: If a key file is missing or invalid.
    """
    if audit_section is None:
        return None
    settings = (
        audit_section
        if isinstance(audit_section, AuditSettings)
        else AuditSettings.model_validate(dict(audit_section))
    )
    if not settings.enabled:
        return None
    return AuditObserver.from_settings(settings, config_digest=config_digest)


def checked_build(settings: Any) -> AuditObserver | None:
    """:func:`build` for the gateway settings, every problem as one ``audit.<key>: ...`` line.

    Used by :func:`gateway.assembly.assemble` (``serve`` and ``check-config``); reads
    the key files but does not open the store.

    Raises:
        ConfigError: If the ``audit:`` section or one of its key files is invalid.
    """
    section = settings.audit
    if isinstance(section, AuditSettings) and section.enabled:
        # Each key file on its own first, so a problem is located at its own key and line.
        for key, read in (("signing_key_file", load_signer),
                          ("pseudonym_key_file", load_pseudonymizer)):
            try:
                read(getattr(section, key))
            except AuditError as exc:
                raise ConfigError(f"audit.{key}: {exc}") from exc
    try:
        observer = build(section, config_digest=config_digest(settings.model_dump_json()))
    except ValidationError as exc:  # a mapping put into already validated settings
        raise InvalidConfig(validation_problems(exc, prefix=("audit",))) from exc
    except AuditError as exc:
        raise ConfigError(f"audit: {exc}") from exc
    if observer is not None and isinstance(settings.audit, AuditSettings):
        _check_store_directory(settings.audit)
    return observer


def _check_store_directory(settings: AuditSettings) -> None:
    """A SQLite store's directory must exist: SQLite creates the file, not its directory, and
    a gateway that finds out in its lifespan has already bound nothing and logged a traceback.

    Raises:
        ConfigError: ``audit.store`` (or ``audit.store_file``) names a file in a directory that
            does not exist or is not a directory.
    """
    file = sqlite_file(settings.store_url())
    if file is None:
        return
    key = "audit.store_file" if settings.store_file is not None else "audit.store"
    folder = file.absolute().parent
    if not folder.is_dir():
        what = "is not a directory" if folder.exists() else "does not exist"
        raise ConfigError(f"{key}: the directory of the SQLite file {file}, {folder}, {what}: "
                          "create it (writable by the gateway) or name another file")
