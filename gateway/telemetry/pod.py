"""The admin port of a pod with several workers: ``/metrics`` and ``/status`` of every worker.

With ``gateway serve --workers N`` each worker keeps its metrics in process (as one gateway
does) and serves them on a Unix socket in a private directory of the supervisor
(:meth:`AdminServer.listen_unix <gateway.telemetry.admin.AdminServer.listen_unix>`). The
supervisor listens on the configured admin port; each scrape reads every worker's
``/metrics`` at that moment and answers one merged exposition, so Prometheus sees the pod, not
the worker that happened to answer. Merging, per sample (same name and labels):

* counters and histograms (``_bucket``, ``_count``, ``_sum``): the sum over the workers (every
  worker has the same bucket bounds: one code base);
* gauges: the sum (requests in flight per replica, audit queue depth), except those named in
  :data:`GAUGE_MERGE`: a replica's health is the minimum (a replica any worker has ejected is
  reported 0), the figures each worker scrapes from the same vLLM replica are the maximum (the
  most pessimistic view).

The supervisor adds ``sg_gateway_workers`` (workers answering this scrape) and
``sg_gateway_worker_restarts_total``. The pod's counters never drop: a worker that does not
answer within the scrape timeout counts with the counters and histograms of its last answer
(its gauges are left out), and the last counters of a worker that exited are kept and added
(a restarted worker starts its own at zero). A drop would read as a counter reset, and
Prometheus' ``rate`` would count the other workers' totals again. What a worker counted after
its last scrape and before it exited is lost.

``/status`` answers the first worker's document (what ``gateway preflight`` reads) with
``guard`` and ``loop`` taken from the worst worker, ``preflight`` merged over the workers
(:func:`gateway.preflight.status.merge_preflight`: a check's worst status), plus ``workers``:
every worker's index, pid, guard, loop, audit replica and pre-flight result. The pid list is
how an operator (and the tests) see which process answers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry.admin import AdminServer

__all__ = ["GAUGE_MERGE", "PodAdminServer", "WorkerEndpoint", "merge_expositions"]

_log = logging.getLogger(__name__)

Merge = Literal["sum", "min", "max"]

#: Gauges not summed over the workers (Prometheus family name -> rule); every other gauge sums.
GAUGE_MERGE: dict[str, Merge] = {
    "sg_gateway_replica_healthy": "min",
    "sg_gateway_replica_waiting": "max",
    "sg_gateway_replica_running": "max",
    "sg_gateway_replica_kv_usage_ratio": "max",
    "sg_gateway_replica_signals_age_seconds": "max",
    "sg_gateway_replica_index_blocks": "max",
    # continuous pre-flight (gateway.preflight.continuous): each worker runs its own rounds
    "sg_preflight_check": "max",
    "sg_preflight_last_run_timestamp_seconds": "min",
    "sg_preflight_interval_seconds": "max",
    "sg_gateway_replica_cache_exact": "min",
    "sg_gateway_replica_exact_blocks": "max",
}

_SCRAPE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class WorkerEndpoint:
    """Where one live worker serves its admin routes.

    Attributes:
        index: Worker index (0..N-1).
        pid: Process id.
        path: Its admin Unix socket.
    """

    index: int
    pid: int
    path: str


def _combine(rule: Merge, a: float, b: float) -> float:
    if rule == "min":
        return min(a, b)
    if rule == "max":
        return max(a, b)
    return a + b


def merge_expositions(texts: Sequence[str]) -> list[Metric]:
    """Merge Prometheus text expositions of several workers into one (rules: module docstring).

    Args:
        texts: One exposition (format 0.0.4) per worker.

    Returns:
        The metric families, in order of first appearance, samples in order of first
        appearance.

    Raises:
        ValueError: A text is not a valid exposition.
    """
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text):
            out = families.get(fam.name)
            if out is None:
                out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type)
                values[fam.name] = {}
            rule: Merge = GAUGE_MERGE.get(fam.name, "sum") if fam.type == "gauge" else "sum"
            points = values[fam.name]
            for sample in fam.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                old = points.get(key)
                points[key] = sample.value if old is None else _combine(rule, old, sample.value)
    for name, fam in families.items():
        for (sample_name, labels), value in values[name].items():
            fam.add_sample(sample_name, dict(labels), value)
    return list(families.values())


def _counters_only(texts: Sequence[str]) -> str:
    """The counters and histograms of ``texts``, merged, as one exposition (no gauges)."""
    kept = [f for f in merge_expositions(texts) if f.type in _MONOTONIC]
    return generate_latest(_Families(kept)).decode("utf-8")


_MONOTONIC = frozenset({"counter", "histogram", "summary"})


class _Families:
    """A ``prometheus_client`` collector over fixed families (one scrape's result)."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


class PodAdminServer(AdminServer):
    """The supervisor's admin server: the routes of :class:`AdminServer` for the whole pod.

    Args:
        host: Listen address (``telemetry.admin.host``).
        port: Listen port (``telemetry.admin.port``).
        workers: ``() -> endpoints`` of the workers running now.
        restarts: ``() -> restarts so far`` (workers restarted after an unexpected exit).
    """

    def __init__(self, host: str, port: int, workers: Callable[[], Sequence[WorkerEndpoint]],
                 restarts: Callable[[], int]) -> None:
        super().__init__(host, port, CollectorRegistry(auto_describe=False))
        self._workers = workers
        self._restarts = restarts
        self._last: dict[int, str] = {}  # pid -> its last /metrics answer
        self._gone = ""  # the counters of the workers that exited, at their last answer

    async def _get(self, worker: WorkerEndpoint, path: str) -> bytes | None:
        try:
            async with aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=worker.path),
                timeout=aiohttp.ClientTimeout(total=_SCRAPE_TIMEOUT_S),
            ) as session, session.get(f"http://worker{path}") as resp:
                if resp.status != 200:
                    raise aiohttp.ClientError(f"HTTP {resp.status}")
                return await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            _log.warning("worker %d (pid %d): GET %s failed: %s", worker.index, worker.pid,
                         path, exc)
            return None

    async def _gather(self, path: str, workers: Sequence[WorkerEndpoint] | None = None,
                      ) -> list[tuple[WorkerEndpoint, bytes]]:
        workers = list(self._workers()) if workers is None else workers
        bodies = await asyncio.gather(*(self._get(w, path) for w in workers))
        return [(w, b) for w, b in zip(workers, bodies, strict=True) if b is not None]

    async def _metrics(self, _: web.Request) -> web.Response:
        workers = list(self._workers())  # serving workers; one leaves the list when it exits
        answered = await self._gather("/metrics", workers)
        texts = {w.pid: body.decode("utf-8") for w, body in answered}
        live = {w.pid for w in workers}
        # No await from here on: concurrent scrapes do not count an exited worker twice.
        exited = [text for pid, text in self._last.items() if pid not in live]
        if exited:
            self._gone = _counters_only([self._gone, *exited])
        silent = [text for pid, text in self._last.items() if pid in live and pid not in texts]
        self._last = {pid: t for pid, t in self._last.items() if pid in live} | texts
        families = merge_expositions([*texts.values(), self._gone,
                                      *(_counters_only([t]) for t in silent)])
        count = Metric("sg_gateway_workers", "Workers of this pod answering this scrape",
                       "gauge")
        count.add_sample("sg_gateway_workers", {}, float(len(answered)))
        restarts = Metric("sg_gateway_worker_restarts",
                          "Workers restarted after an unexpected exit", "counter")
        restarts.add_sample("sg_gateway_worker_restarts_total", {}, float(self._restarts()))
        body = generate_latest(_Families([*families, count, restarts]))
        return web.Response(body=body, headers={"content-type": CONTENT_TYPE_LATEST})

    async def _status_json(self, _: web.Request) -> web.Response:
        import json

        docs: list[dict[str, Any]] = []
        for worker, body in await self._gather("/status"):
            doc = json.loads(body)
            doc["worker"] = worker.index
            docs.append(doc)
        if not docs:
            return web.json_response({"error": "no worker answered"}, status=503)
        out = dict(docs[0])
        guards = [d.get("guard") or {} for d in docs]
        out["guard"] = {
            **guards[0],
            "installed": all(g.get("installed") is True for g in guards),
            "self_test": ("passed" if all(g.get("self_test") == "passed" for g in guards)
                          else "not_run"),
        }
        loops = [str(d.get("loop", "")) for d in docs]
        out["loop"] = next((lp for lp in loops if lp != loops[0]), loops[0])
        if any("preflight" in d for d in docs):  # each worker runs its own rounds
            from gateway.preflight.status import merge_preflight

            out["preflight"] = merge_preflight([d.get("preflight") for d in docs])
        out["workers"] = [
            {"index": d["worker"], "pid": d.get("pid"), "guard": d.get("guard"),
             "loop": d.get("loop"), "audit_replica": (d.get("audit") or {}).get("replica"),
             "config_revision": d.get("config_revision"),
             "preflight": (d.get("preflight") or {}).get("result")}
            for d in docs
        ]
        out.pop("worker", None)
        out.pop("pid", None)
        return web.json_response(out)
