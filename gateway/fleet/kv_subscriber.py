"""Subscribe to each replica's KV-cache events (ZMQ SUB) and keep the exact indexes current.

One :class:`KVEventSubscriber` per configured source (``routing.kv_events``): a SUB socket on
the publisher's endpoint and, when given, a DEALER on its replay endpoint. Every batch carries a
sequence number (:mod:`gateway.fleet.kv_events`):

* the next expected one: applied;
* a higher one (a gap: the SUB socket dropped messages, or the gateway subscribed late): the
  missing batches are asked for on the replay socket from the expected number on and applied in
  order, then the batch itself. With a replay socket the first expected number is 0, so a
  gateway that starts after the replica catches up on the publisher's whole buffer. When the
  replay cannot fill the gap (no replay socket, no answer within ``replay_timeout_s``, or the
  buffer no longer holds the first missing batch) the replica's index is cleared and rebuilt
  from this batch on (``gaps_lost``);
* a lower one: a batch already applied (the replay and the SUB socket both delivered it; the
  same bytes under the same number) is skipped; any other means the publisher restarted (its
  numbers start at 0 again): the index is cleared.

With a replay socket the subscriber also catches up at once when it starts, without waiting for
the replica's next batch.

:meth:`KVEventSubscriber.exact` tells the scorer whether to trust the exact index of a replica:
once a batch has been applied since the (re)start and no gap is unresolved. A replica that
publishes nothing stays on the estimate (:mod:`gateway.fleet.scoring`).

The endpoints are the replica's own host (checked when the feed is built): subscribing contacts
no host the egress policy has not already allowed for the replica's requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import zmq
import zmq.asyncio

from gateway.fleet.kv_events import (
    END_SEQ,
    Event,
    KVEventDecodeError,
    decode_batch,
    decode_seq,
)
from gateway.fleet.settings import KVEventsSource, check_endpoint

if TYPE_CHECKING:
    from gateway.fleet.scoring import PrefixAffinity
    from gateway.fleet.view import Fleet

__all__ = ["KVEventSubscriber", "KVEventsFeed", "check_endpoint"]

_log = logging.getLogger(__name__)

Apply = Callable[[Sequence[Event]], None]


@dataclass(slots=True)
class SubscriberStats:
    """Counters of one subscriber (admin view and metrics)."""

    batches: int = 0
    replayed: int = 0
    gaps: int = 0
    gaps_lost: int = 0
    restarts: int = 0
    decode_errors: int = 0
    last_seq: int | None = None


class KVEventSubscriber:
    """Follows one publisher and hands each batch's events, in order, to ``apply``.

    Args:
        source: The configured endpoints.
        apply: Called with each batch's events (on the event loop).
        clear: Called when the replica's index must be forgotten (restart, lost gap).
        context: The ZMQ context (one per feed).
    """

    def __init__(self, source: KVEventsSource, apply: Apply, clear: Callable[[], None],
                 context: zmq.asyncio.Context) -> None:
        self.source = source
        self._apply = apply
        self._clear = clear
        self._ctx = context
        self.stats = SubscriberStats()
        self._expected: int | None = 0 if source.replay_endpoint else None
        self._synced = False
        self._task: asyncio.Task[None] | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self._pending_gap: tuple[int, list[bytes]] | None = None
        # Recently applied batches: seq -> payload hash (tells a duplicate from a restart).
        self._recent: OrderedDict[int, int] = OrderedDict()

    def exact(self) -> bool:
        """True when the replica's exact index can be trusted (see the module docstring)."""
        return self._synced

    def start(self) -> None:
        """Connect and follow the publisher in a background task."""
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
        sub.connect(self.source.endpoint)
        self._sub = sub
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop following and close the sockets (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None

    async def _run(self) -> None:
        assert self._sub is not None
        if self.source.replay_endpoint is not None:
            await self._catch_up()
        while True:
            frames = await self._sub.recv_multipart()
            try:
                self.handle(frames)
            except Exception:  # one bad message must not stop the subscription
                _log.exception("kv events from %s: message dropped", self.source.endpoint)
            if self._expected is not None and self._pending_gap is not None:
                await self._fill_gap()

    async def _catch_up(self) -> None:
        """Apply what the replay buffer holds from the expected number on (at start)."""
        assert self._expected is not None
        for rseq, payload in await self._replay(self._expected):
            if rseq == self._expected:
                self._take(rseq, payload)
                self.stats.replayed += 1

    def handle(self, frames: Sequence[bytes]) -> None:
        """Process one published ``(topic, seq, payload)`` message (synchronously when in order;
        a gap is recorded for :meth:`_fill_gap`)."""
        if len(frames) != 3:
            self.stats.decode_errors += 1
            return
        try:
            seq = decode_seq(frames[1])
        except KVEventDecodeError:
            self.stats.decode_errors += 1
            return
        expected = self._expected
        if expected is not None and seq > expected:
            self._pending_gap = (seq, list(frames))
            return
        if expected is not None and seq < expected:
            if self._recent.get(seq) == hash(frames[2]):
                return  # delivered twice (replay and SUB): applied already
            self.stats.restarts += 1
            self._recent.clear()
            self._clear()
        self._take(seq, frames[2])

    def _take(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except KVEventDecodeError as exc:
            self.stats.decode_errors += 1
            _log.warning("kv events from %s: seq %d: %s", self.source.endpoint, seq, exc)
            self._expected = seq + 1
            return
        self._apply(batch.events)
        self._recent[seq] = hash(payload)
        if len(self._recent) > 4096:
            self._recent.popitem(last=False)
        self.stats.batches += 1
        self.stats.last_seq = seq
        self._expected = seq + 1
        self._synced = True

    async def _fill_gap(self) -> None:
        assert self._pending_gap is not None and self._expected is not None
        seq, frames = self._pending_gap
        self._pending_gap = None
        start = self._expected
        self.stats.gaps += 1
        got = await self._replay(start) if self.source.replay_endpoint else []
        for rseq, payload in got:
            if rseq == self._expected:
                self._take(rseq, payload)
                self.stats.replayed += 1
        if self._expected < seq:
            # Not recoverable: the index misses stored or removed blocks. Start again.
            self.stats.gaps_lost += 1
            _log.warning("kv events from %s: batches %d..%d lost, index rebuilt",
                         self.source.endpoint, self._expected, seq - 1)
            self._clear()
        if self._expected <= seq:
            self._take(seq, frames[2])

    async def _replay(self, start: int) -> list[tuple[int, bytes]]:
        """Ask the replay socket for batches ``start ..``; [] on a timeout."""
        assert self.source.replay_endpoint is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        out: list[tuple[int, bytes]] = []
        try:
            sock.connect(self.source.replay_endpoint)
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                if not await sock.poll(int(self.source.replay_timeout_s * 1000)):
                    _log.warning("kv events replay %s: no answer", self.source.replay_endpoint)
                    return out
                frames = await sock.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]
                if len(frames) != 2:
                    self.stats.decode_errors += 1
                    continue
                rseq = decode_seq(frames[0])
                if rseq == END_SEQ:
                    return out
                out.append((rseq, frames[1]))
        except KVEventDecodeError:
            self.stats.decode_errors += 1
            return out
        finally:
            sock.close(linger=0)


class KVEventsFeed:
    """The subscribers of every configured source, applied to every pool holding the replica.

    Args:
        router: The pools (``prefix_affinity`` pools carry an exact index).
        sources: ``routing.kv_events``.

    Raises:
        ValueError: A source's endpoint is not on its replica's host (:func:`check_endpoint`).
    """

    def __init__(self, router: Fleet, sources: Sequence[KVEventsSource]) -> None:
        self._router = router
        self._sources = {s.replica: s for s in sources}
        for s in sources:
            check_endpoint(s.endpoint, s.replica)
            if s.replay_endpoint is not None:
                check_endpoint(s.replay_endpoint, s.replica)
        self._ctx: zmq.asyncio.Context | None = None
        self.subscribers: dict[str, KVEventSubscriber] = {}

    def rebind(self, router: Fleet) -> None:
        """Apply events to the pools of ``router`` from now on (live reload); a new pool's
        index starts empty and is trusted from the next batch on."""
        self._router = router
        for url, sub in self.subscribers.items():
            for aff, i in self._targets(url):
                aff.attach_events(i, sub)

    def _targets(self, url: str) -> list[tuple[PrefixAffinity, int]]:
        out: list[tuple[PrefixAffinity, int]] = []
        for pool in self._router.pools.values():
            aff = pool.affinity
            if aff is None:
                continue
            for r in pool.replicas:
                if r.url == url:
                    out.append((aff, r.index))
        return out

    def start(self) -> None:
        """Subscribe to every source."""
        if not self._sources:
            return
        self._ctx = zmq.asyncio.Context()
        for url, source in self._sources.items():
            sub = KVEventSubscriber(source, self._applier(url), self._clearer(url), self._ctx)
            self.subscribers[url] = sub
            for aff, i in self._targets(url):
                aff.attach_events(i, sub)
            sub.start()

    def _applier(self, url: str) -> Apply:
        def apply(events: Sequence[Event]) -> None:
            for aff, i in self._targets(url):
                aff.exact.apply(i, events)
        return apply

    def _clearer(self, url: str) -> Callable[[], None]:
        def clear() -> None:
            for aff, i in self._targets(url):
                aff.exact.clear(i)
        return clear

    async def stop(self) -> None:
        """Unsubscribe and close the ZMQ context."""
        for sub in self.subscribers.values():
            await sub.stop()
        self.subscribers.clear()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
