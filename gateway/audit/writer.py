"""The audit writer: one hash chain per process, group commit, signed checkpoints.

``await log.append({"type": "request.started", ...})`` returns once the record is committed
(durable), so a caller can refuse to act when it raises :class:`AuditUnavailable`. Appends
that arrive while a transaction is in flight wait for the next one: one background task commits
everything pending in a single transaction (group commit), so concurrent requests share the
fsync.

A chain is ``<replica>/<UTC start time>-<random>``. Its first record (``chain.started``)
names the previous chain of the same replica with that chain's newest checkpoint and its last
stored record (:mod:`gateway.audit.chains`), so a restart cannot silently drop the previous
chain's tail. A signed
checkpoint is written in the same transaction as the batch that makes it due (every
``checkpoint_every_records`` records, or ``checkpoint_every_s`` after the first unsealed
record); when idle for ``heartbeat_s`` the writer appends an ``audit.heartbeat`` record and
seals it. :meth:`AuditLog.close` appends ``chain.closed`` and a final checkpoint. With a
checkpoint directory each new checkpoint is also written there
(:mod:`gateway.audit.checkpoint_dir`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from gateway.audit.backends import open_store
from gateway.audit.chains import new_chain_id, previous_link
from gateway.audit.checkpoint import Checkpoint, Signer, load_signer, sign_checkpoint
from gateway.audit.checkpoint_dir import write_checkpoint_file
from gateway.audit.errors import AuditError, AuditFormatError, AuditUnavailable
from gateway.audit.merkle import CompactRange
from gateway.audit.records import (
    CHAIN_CLOSED,
    CHAIN_STARTED,
    GENESIS_PREV,
    HEARTBEAT,
    Record,
    canonical_json,
    make_record,
)
from gateway.audit.settings import AuditSettings
from gateway.audit.store import ChainInfo, Store, StoredCheckpoint

_log = logging.getLogger(__name__)

_RESERVED_TYPES = frozenset({CHAIN_STARTED, CHAIN_CLOSED, HEARTBEAT})


@dataclass(frozen=True, slots=True)
class Receipt:
    """Proof of a committed append: where the record sits in which chain."""

    chain: str
    seq: int
    hash: bytes


@dataclass(slots=True)
class _Pending:
    type: str
    data: dict[str, Any]
    future: asyncio.Future[Receipt] | None


def _now_us() -> int:
    return time.time_ns() // 1000


AppendListener = Callable[[str, float, bool], None]
"""``(record type, seconds until durable or failed, ok)`` after each append."""


class AuditLog:
    """Asynchronous, group-committing, checkpointing audit writer (see module docstring).

    Args:
        store: An (unopened) store; the log opens and closes it.
        signer: Ed25519 signed-note signer for checkpoints.
        replica_id: Names the chains of this replica.
        checkpoint_every_records: Seal after this many unsealed records.
        checkpoint_every_s: Seal unsealed records at the latest after this many seconds.
        heartbeat_s: When idle this long, append a heartbeat record and seal it.
        checkpoint_dir: Also keep each chain's newest checkpoint as a file here.
        max_batch_records: Most records per transaction.
        start_info: Extra fields for the ``chain.started`` record (e.g. version, config hash).
    """

    def __init__(
        self,
        store: Store,
        signer: Signer,
        *,
        replica_id: str,
        checkpoint_every_records: int = 1000,
        checkpoint_every_s: float = 10.0,
        heartbeat_s: float = 60.0,
        checkpoint_dir: Path | None = None,
        max_batch_records: int = 512,
        start_info: Mapping[str, Any] | None = None,
    ) -> None:
        self.store = store
        self._signer = signer
        self.replica_id = replica_id
        self._cp_records = checkpoint_every_records
        self._cp_s = checkpoint_every_s
        self._heartbeat_s = heartbeat_s
        self._cp_dir = checkpoint_dir
        self._max_batch = max_batch_records
        self._start_info = dict(start_info or {})
        self.chain_id = new_chain_id(replica_id)
        self._range = CompactRange()
        self._prev = bytes.fromhex(GENESIS_PREV)
        self._sealed_size = 0
        self._sealed_at = time.monotonic()
        self._last_append = time.monotonic()
        self._pending: list[_Pending] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._state = "new"
        self._needs_resync = False
        self._retry_at = 0.0
        self._commit_lock = asyncio.Lock()
        self._uncertain: CompactRange | None = None  # the state if a failed batch landed
        self.latest_checkpoint: StoredCheckpoint | None = None
        self._listeners: list[AppendListener] = []

    @classmethod
    def from_settings(cls, settings: AuditSettings, **extra: Any) -> AuditLog:
        """Build a log from :class:`AuditSettings` (reads the signing key file).

        Raises:
            AuditConfigError: If the key file cannot be read or the store URL is invalid.
        """
        return cls(
            open_store(settings.store_url(), timeout_s=settings.store_timeout_s),
            load_signer(settings.signing_key_file),
            replica_id=settings.replica_id,
            checkpoint_every_records=settings.checkpoint_every_records,
            checkpoint_every_s=settings.checkpoint_every_s,
            heartbeat_s=settings.heartbeat_s,
            checkpoint_dir=settings.checkpoint_dir,
            max_batch_records=settings.max_batch_records,
            **extra,
        )

    def add_append_listener(self, listener: AppendListener) -> None:
        """Call ``listener(type, seconds, ok)`` after every :meth:`append` (metrics).

        ``seconds`` is the time until the record was durable (or the append failed, then
        ``ok`` is ``False``). Listeners run on the event loop and must not raise or block.
        """
        self._listeners.append(listener)

    @property
    def queue_depth(self) -> int:
        """Records appended but not yet committed."""
        return len(self._pending)

    @property
    def size(self) -> int:
        """Number of committed records in this chain."""
        return self._range.size

    @property
    def running(self) -> bool:
        """True between a successful :meth:`start` and :meth:`close`."""
        return self._state == "running"

    async def __aenter__(self) -> AuditLog:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Open the store, write ``chain.started`` (sealed) and start the committer.

        Raises:
            AuditUnavailable: If the store cannot be opened or written.
        """
        if self._state != "new":
            raise AuditError("an AuditLog can be started only once")
        await self.store.open()
        try:
            data = await self._start_record_data()
            now = _now_us()
            first = make_record(
                chain=self.chain_id,
                seq=0,
                prev=self._prev,
                ts_us=now,
                type_=CHAIN_STARTED,
                data=data,
            )
            rng = self._range.copy()
            rng.append(first.hash)
            cp = self._make_checkpoint(rng, now)
            info = ChainInfo(self.chain_id, self.replica_id, now, 0)
            await self.store.append_batch([first], [cp], new_chain=info)
        except BaseException:
            await self.store.close()
            raise
        self._apply([first], rng, cp)
        await self._export_checkpoint(cp)
        self._state = "running"
        self._task = asyncio.create_task(self._run(), name=f"audit-writer {self.chain_id}")
        _log.info("audit chain %s started in %s", self.chain_id, self.store.display_url)

    async def _start_record_data(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            **self._start_info,
            "replica": self.replica_id,
            "pid": os.getpid(),
            "key_name": self._signer.name,
            "key_id": self._signer.verifier.key_id.hex(),
            "heartbeat_ms": int(self._heartbeat_s * 1000),
            "checkpoint_every_ms": int(self._cp_s * 1000),
            "checkpoint_every_records": self._cp_records,
            **await previous_link(self.store, self.replica_id),
        }
        canonical_json(data)
        return data

    async def append(self, event: Mapping[str, Any]) -> Receipt:
        """Append one event and wait until it is durable (append listeners are told after).

        Args:
            event: ``{"type": "<record type>", ...fields}``; fields must be JSON with integers
                only (no floats). ``request_id`` (str) is indexed for ``prove``.

        Returns:
            The record's chain, sequence number and hash.

        Raises:
            AuditFormatError: If the event is malformed (a programming error).
            AuditUnavailable: If the record could not be committed; act as if unaudited.
        """
        if not self._listeners:
            return await self._append(event)
        t0 = time.perf_counter()
        ok = False
        try:
            receipt = await self._append(event)
            ok = True
            return receipt
        finally:
            seconds = time.perf_counter() - t0
            for listener in self._listeners:
                listener(str(event.get("type", "")), seconds, ok)

    async def _append(self, event: Mapping[str, Any]) -> Receipt:
        type_ = event.get("type")
        if not isinstance(type_, str) or not type_ or type_ in _RESERVED_TYPES:
            raise AuditFormatError(f"event type must be a non-reserved string, got {type_!r}")
        data = {k: v for k, v in event.items() if k != "type"}
        # The fields are checked (integers only, JSON values) by the committer when it builds
        # the record: an invalid event fails only its own append, not the batch.
        if self._state != "running":
            raise AuditUnavailable(f"audit log is {self._state}, not running")
        future: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(type_, data, future))
        self._wakeup.set()
        # Awaited directly (no shield: its callback costs the caller an extra turn of the
        # event loop): a caller cancelled meanwhile cancels only its future; the record stays
        # in the batch and is committed all the same (the committer skips a done future).
        return await future

    async def checkpoint(self) -> StoredCheckpoint | None:
        """Seal everything committed so far now (no-op when already sealed).

        Raises:
            AuditUnavailable: If the checkpoint could not be stored.
        """
        if self._range.size == self._sealed_size:
            return self.latest_checkpoint
        await self._commit([], force_checkpoint=True, raise_errors=True)
        return self.latest_checkpoint

    async def close(self) -> None:
        """Commit pending appends, append ``chain.closed`` with a final checkpoint, close."""
        if self._state != "running":
            if self._state == "new":
                self._state = "closed"
            return
        self._state = "closing"
        self._wakeup.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        try:
            await self._commit(
                [_Pending(CHAIN_CLOSED, {"size": self._range.size + 1}, None)],
                force_checkpoint=True,
                raise_errors=True,
            )
        except AuditError as exc:
            _log.error("audit chain %s could not be closed cleanly: %s", self.chain_id, exc)
        finally:
            self._state = "closed"
            await self.store.close()

    # -- committer -------------------------------------------------------------------------

    def _heartbeat_due(self) -> float:
        return self._last_append + self._heartbeat_s

    def _next_deadline(self) -> float:
        deadline = self._heartbeat_due()
        if self._range.size > self._sealed_size:
            deadline = min(deadline, self._sealed_at + self._cp_s)
        return max(deadline, self._retry_at)

    async def _run(self) -> None:
        while True:
            if not self._pending:
                if self._state != "running":
                    return
                timeout = max(0.0, self._next_deadline() - time.monotonic())
                # asyncio.timeout, not wait_for: no task per wait, and an append wakes this
                # task on the next turn of the event loop (wait_for took three: its task,
                # its waiter, then this task), so a batch starts at once.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wakeup.wait()
                self._wakeup.clear()
            try:
                if self._pending:
                    batch = self._pending[: self._max_batch]
                    del self._pending[: self._max_batch]
                    await self._commit(batch)
                elif self._state == "running" and time.monotonic() >= self._next_deadline():
                    # Idle for heartbeat_s: a record proves the writer was alive (verify
                    # bounds the gap between records); otherwise seal what is unsealed.
                    if time.monotonic() >= self._heartbeat_due():
                        await self._commit([_Pending(HEARTBEAT, {}, None)], force_checkpoint=True)
                    else:
                        await self._commit([], force_checkpoint=True)
            except Exception:
                _log.exception("audit committer error in chain %s", self.chain_id)
                await asyncio.sleep(0.1)

    def _make_checkpoint(self, rng: CompactRange, now_us: int) -> StoredCheckpoint:
        cp = Checkpoint(self.chain_id, rng.size, rng.root())
        return StoredCheckpoint(self.chain_id, rng.size, sign_checkpoint(cp, self._signer), now_us)

    def _apply(self, records: list[Record], rng: CompactRange, cp: StoredCheckpoint | None) -> None:
        self._range = rng
        if records:
            self._prev = records[-1].hash
            self._last_append = time.monotonic()
        if cp is not None:
            self._sealed_size = cp.size
            self._sealed_at = time.monotonic()
            self.latest_checkpoint = cp

    async def _resync(self) -> None:
        """After a failed commit, adopt what the store really holds (a commit may have landed)."""
        last = await self.store.last_record(self.chain_id)
        stored_size = 0 if last is None else last.seq + 1
        uncertain, self._uncertain = self._uncertain, None
        if stored_size == self._range.size and (last is None or last.hash == self._prev):
            pass  # the failed batch did not land
        elif (
            uncertain is not None
            and last is not None
            and stored_size == uncertain.size
            and last.hash == uncertain.last_leaf
        ):
            self._range, self._prev = uncertain, last.hash  # it did land
        else:
            await self._rebuild()
        cps = await self.store.checkpoints(self.chain_id)
        if cps:
            newest = max(cps, key=lambda c: c.size)
            self._sealed_size = newest.size
            self.latest_checkpoint = newest
        self._needs_resync = False

    async def _rebuild(self) -> None:
        stored: list[Record] = []
        while True:
            page = await self.store.read_records(self.chain_id, len(stored), 10_000)
            stored.extend(page)
            if len(page) < 10_000:
                break
        rng = CompactRange()
        for rec in stored:
            rng.append(rec.hash)
        self._range = rng
        self._prev = stored[-1].hash if stored else bytes.fromhex(GENESIS_PREV)

    async def _commit(
        self, batch: list[_Pending], *, force_checkpoint: bool = False, raise_errors: bool = False
    ) -> None:
        # One commit at a time: each builds on the state the previous one left.
        async with self._commit_lock:
            await self._commit_locked(batch, force_checkpoint, raise_errors)

    async def _commit_locked(
        self, batch: list[_Pending], force_checkpoint: bool, raise_errors: bool
    ) -> None:
        rng: CompactRange | None = None
        accepted: list[_Pending] = []
        try:
            if self._needs_resync:
                await self._resync()
            rng = self._range.copy()
            prev = self._prev
            records: list[Record] = []
            now = _now_us()
            for item in batch:
                try:
                    rec = make_record(
                        chain=self.chain_id,
                        seq=rng.size,
                        prev=prev,
                        ts_us=now,
                        type_=item.type,
                        data=item.data,
                    )
                except AuditFormatError as exc:  # a malformed event: fail its append only
                    if item.future is not None and not item.future.done():
                        item.future.set_exception(exc)
                    continue
                records.append(rec)
                accepted.append(item)
                rng.append(rec.hash)
                prev = rec.hash
            unsealed = rng.size - self._sealed_size
            due = unsealed >= self._cp_records or (
                unsealed > 0 and time.monotonic() - self._sealed_at >= self._cp_s
            )
            cp = self._make_checkpoint(rng, now) if (due or force_checkpoint) and unsealed else None
            if not records and cp is None:
                return
            await self.store.append_batch(records, [cp] if cp else [])
        except Exception as exc:
            err = (
                exc
                if isinstance(exc, AuditUnavailable)
                else AuditUnavailable(f"audit append failed: {exc!r}")
            )
            self._needs_resync = True
            if rng is not None:
                self._uncertain = rng
            # Retry idle work (heartbeat/checkpoint) no sooner than a second from now.
            self._retry_at = time.monotonic() + 1.0
            for item in batch:
                if item.future is not None and not item.future.done():
                    item.future.set_exception(err)
            if raise_errors:
                raise err from exc
            _log.warning("audit append failed in chain %s: %s", self.chain_id, err)
            return
        self._apply(records, rng, cp)
        for item, rec in zip(accepted, records, strict=True):
            if item.future is not None and not item.future.done():
                item.future.set_result(Receipt(rec.chain, rec.seq, rec.hash))
        if cp is not None:
            await self._export_checkpoint(cp)

    async def _export_checkpoint(self, cp: StoredCheckpoint) -> None:
        if self._cp_dir is None:
            return
        try:
            await asyncio.to_thread(write_checkpoint_file, self._cp_dir, cp.chain, cp.note)
        except OSError as exc:
            _log.error("cannot export checkpoint of %s to %s: %s", cp.chain, self._cp_dir, exc)
