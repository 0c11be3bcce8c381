"""Metrics rendered as Prometheus text (``/metrics`` on the admin port).

:class:`PrometheusCollector` is a ``prometheus_client`` collector over a
:class:`~gateway.telemetry.aggregate.MetricSet`: each scrape snapshots the instruments and
``prometheus_client.generate_latest`` writes the text exposition format (0.0.4).

Names follow the OpenTelemetry-to-Prometheus compatibility rules: dots and other invalid
characters become ``_``, the unit is appended (``s`` -> ``_seconds``, ``By`` -> ``_bytes``;
annotations such as ``{token}`` add nothing) and counters end in ``_total``.
``gen_ai.server.time_to_first_token`` (unit ``s``) is
``gen_ai_server_time_to_first_token_seconds``; attribute keys become label names the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from gateway.telemetry.aggregate import MetricSet, Snapshot

__all__ = ["PrometheusCollector", "prometheus_name"]

_INVALID = re.compile(r"[^a-zA-Z0-9_:]")
_UNITS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": "ratio"}


def prometheus_name(name: str, unit: str = "") -> str:
    """The Prometheus name of an OpenTelemetry instrument (see module docstring)."""
    base = _INVALID.sub("_", name)
    suffix = _UNITS.get(unit, "" if unit.startswith("{") or not unit else _INVALID.sub("_", unit))
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    return base


class PrometheusCollector(Collector):
    """Renders a metric set for ``prometheus_client`` (register it with a registry).

    Args:
        metrics: The instruments to render.
    """

    def __init__(self, metrics: MetricSet) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        """One family per instrument with data."""
        for snap in self._metrics.snapshots():
            if snap.points:
                yield _family(snap)


def _family(s: Snapshot) -> Metric:
    name = prometheus_name(s.name, s.unit)
    labels = [_INVALID.sub("_", n) for n in s.label_names]

    def lab(values: tuple[object, ...]) -> dict[str, str]:
        return {k: str(v) for k, v in zip(labels, values, strict=True)}

    if s.kind == "histogram":
        fam = HistogramMetricFamily(name, s.description or s.name)
        bounds = [repr(float(b)) for b in s.bounds] + ["+Inf"]
        for key, (counts, total, count, _, _) in s.points.items():
            base = lab(key)
            cumulative = 0
            for le, n in zip(bounds, counts, strict=True):
                cumulative += n
                fam.add_sample(name + "_bucket", {**base, "le": le}, float(cumulative))
            fam.add_sample(name + "_count", base, float(count))
            fam.add_sample(name + "_sum", base, float(total))
        return fam
    if s.kind == "counter":
        cname = name.removesuffix("_total")
        cfam = CounterMetricFamily(cname, s.description or s.name)
        for key, value in s.points.items():
            cfam.add_sample(cname + "_total", lab(key), float(value))
        return cfam
    gfam = GaugeMetricFamily(name, s.description or s.name)
    for key, value in s.points.items():
        gfam.add_sample(name, lab(key), float(value))
    return gfam
