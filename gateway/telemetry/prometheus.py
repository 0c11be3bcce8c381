"""OpenTelemetry metrics rendered as Prometheus text (``/metrics`` on the admin port).

:class:`PrometheusReader` is a pull ``MetricReader``: each scrape collects the SDK's cumulative
metrics and converts them into ``prometheus_client`` metric families, which
``prometheus_client.generate_latest`` writes in the text exposition format (0.0.4).

Names follow the OpenTelemetry-to-Prometheus compatibility rules: dots and other invalid
characters become ``_``, the unit is appended (``s`` -> ``_seconds``, ``By`` -> ``_bytes``;
annotations such as ``{token}`` add nothing) and counters get ``_total`` from the client
library. ``gen_ai.server.time_to_first_token`` (unit ``s``) is
``gen_ai_server_time_to_first_token_seconds``; attribute keys become label names the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from opentelemetry.sdk.metrics import Counter, Histogram, ObservableCounter, UpDownCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    HistogramDataPoint,
    MetricReader,
    MetricsData,
    NumberDataPoint,
    Sum,
)
from opentelemetry.sdk.metrics.export import (
    Histogram as HistogramData,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = ["PrometheusReader", "prometheus_name"]

_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
_UNITS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": "ratio"}


def prometheus_name(name: str, unit: str = "") -> str:
    """The Prometheus name of an OpenTelemetry instrument (see module docstring)."""
    base = _INVALID.sub("_", name)
    suffix = _UNITS.get(unit, "" if unit.startswith("{") or not unit else _INVALID.sub("_", unit))
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    return base


def _labels(attributes: Any) -> dict[str, str]:
    return {_INVALID.sub("_", k): str(v) for k, v in (attributes or {}).items()}


class PrometheusReader(MetricReader):
    """A pull reader; :attr:`collector` is the ``prometheus_client`` side of it.

    Register :attr:`collector` with a ``CollectorRegistry`` and pass the reader to the
    ``MeterProvider``'s ``metric_readers``; every scrape collects the SDK once.
    """

    def __init__(self) -> None:
        super().__init__(
            preferred_temporality={
                Counter: AggregationTemporality.CUMULATIVE,
                UpDownCounter: AggregationTemporality.CUMULATIVE,
                Histogram: AggregationTemporality.CUMULATIVE,
                ObservableCounter: AggregationTemporality.CUMULATIVE,
            }
        )
        self._data: MetricsData | None = None
        self.collector = _Bridge(self)

    def _receive_metrics(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> None:
        self._data = metrics_data

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Nothing to release (pull reader)."""

    def families(self) -> Iterator[Metric]:
        """Collect the SDK and yield Prometheus metric families."""
        self._data = None
        try:
            self.collect()
        except Exception:  # not registered with a provider yet: nothing to show
            return
        data = self._data
        if data is None:
            return
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    yield from _families(metric.name, metric.unit or "", metric.description or "",
                                         metric.data)


class _Bridge(Collector):
    def __init__(self, reader: PrometheusReader) -> None:
        self._reader = reader

    def collect(self) -> Iterator[Metric]:
        return self._reader.families()


def _families(name: str, unit: str, doc: str, data: Any) -> Iterable[Metric]:
    pname = prometheus_name(name, unit)
    if isinstance(data, HistogramData):
        fam = HistogramMetricFamily(pname, doc or name, labels=None)
        for hp in data.data_points:
            assert isinstance(hp, HistogramDataPoint)
            buckets: list[tuple[str, float]] = []
            cumulative = 0
            for bound, count in zip(hp.explicit_bounds, hp.bucket_counts, strict=False):
                cumulative += count
                buckets.append((_bound(bound), cumulative))
            buckets.append(("+Inf", hp.count))
            labels = _labels(hp.attributes)
            _add_histogram(fam, pname, labels, buckets, hp.sum)
        yield fam
    elif isinstance(data, Sum) and data.is_monotonic:
        cname = pname.removesuffix("_total")
        cfam = CounterMetricFamily(cname, doc or name)
        for np in data.data_points:
            assert isinstance(np, NumberDataPoint)
            cfam.add_sample(cname + "_total", _labels(np.attributes), float(np.value))
        yield cfam
    elif isinstance(data, (Sum, Gauge)):
        gfam = GaugeMetricFamily(pname, doc or name)
        for np in data.data_points:
            assert isinstance(np, NumberDataPoint)
            gfam.add_sample(pname, _labels(np.attributes), float(np.value))
        yield gfam


def _bound(value: float) -> str:
    return repr(float(value))


def _add_histogram(
    fam: HistogramMetricFamily,
    name: str,
    labels: dict[str, str],
    buckets: list[tuple[str, float]],
    total: float,
) -> None:
    for le, count in buckets:
        fam.add_sample(name + "_bucket", {**labels, "le": le}, float(count))
    fam.add_sample(name + "_count", labels, float(buckets[-1][1]))
    fam.add_sample(name + "_sum", labels, float(total))
