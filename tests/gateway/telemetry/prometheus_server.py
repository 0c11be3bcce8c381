"""A real Prometheus (Debian's ``prometheus`` package) on loopback for the telemetry tests, and a
checker that runs every PromQL expression of a Grafana dashboard through its query API.

* :class:`PrometheusServer`: writes a config that scrapes the given targets every
  ``scrape_interval_s``, runs ``prometheus`` with its TSDB in a temporary folder on a free loopback
  port, and stops it (SIGTERM) at :meth:`PrometheusServer.stop`. The system service is never used.
* :func:`dashboard_queries` / :func:`check_dashboard`: the expressions of a dashboard (panel
  targets, nested row panels, and the ``label_values(metric, label)`` template variables) with
  Grafana's variables replaced, run through ``/api/v1/query`` and ``/api/v1/series``; a problem is
  an error answer, or no series (or only NaN) for a query that traffic should have filled.

Prometheus HTTP API: https://prometheus.io/docs/prometheus/latest/querying/api/
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import free_port

# The values Grafana would substitute when every model and key is selected (the variables'
# allValue) and a rate window wide enough to cover the whole test run.
GRAFANA_VARIABLES = {"model": ".*", "key": ".*", "__rate_interval": "5m", "__interval": "15s"}


class PromQLError(Exception):
    """Prometheus answered a query with ``status: error`` (bad syntax, unknown function, ...)."""


def prometheus_binary(name: str = "prometheus") -> str:
    """The path of ``prometheus`` or ``promtool``.

    Raises:
        FileNotFoundError: Not installed (``make tools`` / ``.ci/run`` install Debian's package).
    """
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(f"{name} is not on PATH: install Debian's prometheus package "
                                "(`make tools` does it when it is missing)")
    return path


class PrometheusServer:
    """One Prometheus process scraping ``targets`` (``host:port`` of ``/metrics`` endpoints).

    Args:
        workdir: Folder for the config file, the TSDB and the log (created).
        targets: ``host:port`` strings scraped at ``/metrics``.
        scrape_interval_s: Scrape (and evaluation) interval in seconds.
    """

    def __init__(self, workdir: Path, targets: list[str], scrape_interval_s: float = 0.5) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        ms = int(scrape_interval_s * 1000)
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "prometheus.yml"
        self.config.write_text(
            f"global:\n  scrape_interval: {ms}ms\n  evaluation_interval: {ms}ms\n"
            "scrape_configs:\n  - job_name: sovereign-gateway\n"
            f"    scrape_interval: {ms}ms\n    scrape_timeout: {ms}ms\n"
            f"    static_configs:\n      - targets: {json.dumps(targets)}\n")
        self.log = workdir / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60.0) -> PrometheusServer:
        """Run Prometheus and wait (bounded) until ``/-/ready`` answers 200.

        Raises:
            RuntimeError: Prometheus exited or did not become ready (its log is in the message).
        """
        cmd = [prometheus_binary(), f"--config.file={self.config}",
               f"--storage.tsdb.path={self.workdir / 'tsdb'}",
               f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]
        with self.log.open("wb") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(self.url + "/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM and wait (idempotent)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def _get(self, path: str, params: Mapping[str, Any]) -> Any:
        r = httpx.get(self.url + path, params=params, timeout=10)
        body = r.json()
        if body.get("status") != "success":
            raise PromQLError(f"{body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query at now; returns the result vector (``[]`` when no series).

        Raises:
            PromQLError: Prometheus refused the expression (its error text is the message).
        """
        data = self._get("/api/v1/query", {"query": expr})
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def series(self, match: str) -> list[dict[str, str]]:
        """Label sets of the series matching the selector ``match``.

        Raises:
            PromQLError: Prometheus refused the selector.
        """
        return list(self._get("/api/v1/series", {"match[]": match}))

    def wait_for(self, expr: str, cond: Callable[[float], bool], timeout_s: float = 30.0) -> float:
        """Poll ``expr`` (bounded) until its first sample's value satisfies ``cond``.

        Raises:
            AssertionError: The condition did not hold within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        value = math.nan
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                value = float(result[0]["value"][1])
                if cond(value):
                    return value
            time.sleep(0.1)
        raise AssertionError(f"{expr}: last value {value} after {timeout_s} s")


@dataclass(frozen=True)
class DashboardQuery:
    """One expression of a dashboard: ``where`` names it (``panel 7 "TTFT" A``)."""

    key: str  # "panel:<id>:<refId>" or "variable:<name>"
    where: str
    expr: str  # with Grafana's variables replaced


def render(expr: str, variables: Mapping[str, str] = GRAFANA_VARIABLES) -> str:
    """Replace Grafana's ``$name`` / ``${name}`` variables.

    Raises:
        KeyError: A variable without a value (so a new variable cannot slip through unrun).
    """
    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in variables:
            raise KeyError(f"no test value for Grafana variable ${name} in {expr!r}")
        return variables[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[DashboardQuery]:
    """Every PromQL expression of ``dashboard`` (Grafana JSON model), variables replaced.

    ``label_values(metric, label)`` variables become a ``metric`` series lookup (their label is
    checked by :func:`check_dashboard`).

    Raises:
        ValueError: A target without ``expr`` or a query variable that is not ``label_values``.
    """
    out: list[DashboardQuery] = []
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\)\s*", q)
        if m is None:
            raise ValueError(f"variable {var['name']}: {q!r} is not label_values(metric, label)")
        out.append(DashboardQuery(f"variable:{var['name']}:{m.group(2)}",
                                  f"variable ${var['name']}", render(m.group(1))))
    for panel in _panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            where = f"panel {panel.get('id')} {panel.get('title')!r} {target.get('refId')}"
            if not target.get("expr"):
                raise ValueError(f"{where}: target without a PromQL expr")
            out.append(DashboardQuery(f"panel:{panel.get('id')}:{target.get('refId')}",
                                      where, render(target["expr"])))
    return out


def check_dashboard(prom: PrometheusServer, dashboard: Mapping[str, Any],
                    may_be_empty: Mapping[str, str]) -> list[str]:
    """Run every query of ``dashboard``; return the problems (``[]``: all fine).

    Args:
        prom: The Prometheus that scraped the gateway.
        dashboard: Grafana dashboard JSON model.
        may_be_empty: ``DashboardQuery.key`` -> why that query has no series in this run.

    Returns:
        One line per problem: an error answer; no series or a NaN value for a query not in
        ``may_be_empty``, or only NaN values; a template variable whose label is on no series.
    """
    problems = []
    for q in dashboard_queries(dashboard):
        try:
            if q.key.startswith("variable:"):
                label = q.key.rsplit(":", 1)[1]
                values = {s.get(label) for s in prom.series(q.expr)} - {None, ""}
                if not values:
                    problems.append(f"{q.where}: no series of {q.expr} with label {label}")
                continue
            result = prom.query(q.expr)
        except PromQLError as exc:
            problems.append(f"{q.where}: {q.expr}: {exc}")
            continue
        if q.key in may_be_empty:
            continue
        if not result:
            problems.append(f"{q.where}: no series: {q.expr}")
        elif all(math.isnan(float(r["value"][1])) for r in result):
            # one NaN series is normal (a quantile of a label set without observations in the
            # window, e.g. the audit's one config.loaded record at start); all NaN is not
            problems.append(f"{q.where}: only NaN (no observations in the window): {q.expr}")
    return problems
