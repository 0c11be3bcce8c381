"""Reading records for ``export`` and ``tail`` (no verification; use ``verify`` for that)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from gateway.audit.records import Record
from gateway.audit.store import Store

_PAGE = 1000


async def export_records(
    store: Store, since_us: int | None = None, until_us: int | None = None
) -> AsyncIterator[Record]:
    """Yield records with ``since_us <= ts_us < until_us`` in insertion order.

    Args:
        store: An opened store.
        since_us: Inclusive lower bound, microseconds since the epoch (None: no bound).
        until_us: Exclusive upper bound, microseconds since the epoch (None: no bound).

    Raises:
        AuditUnavailable: If the store cannot be read.
    """
    after = 0
    while True:
        page = await store.scan(after, _PAGE, since_us, until_us)
        for row_id, rec in page:
            after = row_id
            yield rec
        if len(page) < _PAGE:
            return


async def tail_records(
    store: Store, *, last: int = 10, follow: bool = False, poll_s: float = 1.0
) -> AsyncIterator[Record]:
    """Yield the newest ``last`` records, then (with ``follow``) new ones as they arrive.

    Args:
        store: An opened store.
        last: How many existing records to show first.
        follow: Keep polling for new records until cancelled.
        poll_s: Poll interval in seconds.

    Raises:
        AuditUnavailable: If the store cannot be read.
    """
    rows: list[tuple[int, Record]] = []
    after = 0
    while True:
        page = await store.scan(after, _PAGE)
        rows = (rows + page)[-last:] if last > 0 else []
        if page:
            after = page[-1][0]
        if len(page) < _PAGE:
            break
    for _, rec in rows:
        yield rec
    while follow:
        await asyncio.sleep(poll_s)
        for row_id, rec in await store.scan(after, _PAGE):
            after = row_id
            yield rec


async def subject_records(records: AsyncIterator[Record], subject: str) -> AsyncIterator[Record]:
    """The records of one data subject (a data-subject access request): every record whose
    ``identity.subject`` is the pseudonym ``subject`` (requests, MCP requests, the Batch API's
    ``batch.*`` records), and the records that amend those requests and carry the request id
    only (``request.completed``, ``request.undelivered``, ``mcp.undelivered``).

    Args:
        records: Records in insertion order (:func:`export_records`).
        subject: The subject's pseudonym (``hmac-sha256:<hex>``).

    Memory: the request ids of the subject's records seen so far (an amendment may follow
    its request's completion), about 130 bytes each.
    """
    requests: set[str] = set()
    for_request = ("request.completed", "request.undelivered", "mcp.undelivered")
    async for rec in records:
        data = rec.decoded().get("data") or {}
        identity = data.get("identity")
        request_id = data.get("request_id")
        if isinstance(identity, dict) and identity.get("subject") == subject:
            if isinstance(request_id, str):
                requests.add(request_id)
            yield rec
        elif rec.type in for_request and request_id in requests:
            yield rec
