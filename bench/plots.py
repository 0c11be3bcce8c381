#!/usr/bin/env python3
"""Plots of the benchmarks' own JSON output, for the docs (``make bench-plots``).

    python bench/plots.py --relay RELAY.json --routing ROUTING.json \\
        [--routing ROUTING-EVENTS.json] --grid GRID.json --out docs/plots

Each input is optional (at least one is needed) and gives its figures:

* ``--relay``: what ``bench/relay.py --json`` writes, ``{"started", "cpu", "args", "targets":
  {NAME: results}}``. From the paced phase (``--only stalls``) it draws, per target (the
  gateway, nginx beside it, the backend direct): the share of stall-free streams (%), the p99
  gap between events (ms) and the relay's CPU per event (µs), one bar chart each:
  ``relay-stalls.svg`` and ``relay-stalls.png``.
* ``--routing`` (repeatable, one run per cache state): what ``bench/routing.py --json`` writes,
  ``{"args", "workloads": {WORKLOAD: {"params", "results": {STRATEGY: summary}}}}``. Each run is
  labelled with the cache state its gateways scored from, read from its ``args``: ``exact (KV
  events)`` when the run had ``--kv-events --prompt-format tokens`` (every pod follows the
  replicas' KV-cache events and matches the prompts' token ids), ``estimate`` otherwise (each
  gateway's own prefix index of the requests it routed). ``routing-ttft.svg``: TTFT p50/p90/p99
  (s) per strategy (the gateway's, the client-side references, ``vllm-router:*``), one panel per
  workload and run. ``routing-pods.svg`` when a run had ``--gateways N`` rows (``NAME@Npods``):
  TTFT p50 and the prefix-cache hit ratio of each gateway strategy through one pod and through
  N, for each run side by side.
* ``--grid``: what ``bench/flow_grid.py --json`` writes. ``flow-grid.svg``: per grid point,
  interactive p99 TTFT over its unloaded value with and without flow control (and with a
  reserve, when the run had ``--reserve``; log scale, the 1.5x target drawn), and batch
  throughput with flow control over without it (its configured share drawn). The title names
  the run (its start time) and its parameters.

The SVGs are written without timestamps or random ids, so that drawing the same JSON again gives
the same file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

PANELS = (("stall_free_pct", "stall-free streams (%)"),
          ("gap_p99_ms", "p99 gap between events (ms)"),
          ("cpu_us_per_event", "relay CPU per event (µs)"))
_GATEWAY, _PEER, _REFERENCE = "#0969da", "#cf222e", "#8c959f"
_PODS = re.compile(r"^(?P<name>.+)@(?P<n>\d+)pods$")
_ESTIMATE_COLOR = "#bf8700"  # the gateway's estimate; _GATEWAY blue for the exact state
EXACT, ESTIMATE = "exact (KV events)", "estimate"


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, set up for stable, searchable SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "sovereign-gateway"  # stable ids in the SVG
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, small
    return plt


def _save_svg(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Date": None})
    return path


def relay_stalls(doc: dict[str, Any], out: Path) -> list[Path]:
    """Draw the paced-phase figures of one relay benchmark run; the files written.

    Raises:
        ValueError: No target has the paced phase's figures (run with ``--only stalls``).
    """
    plt = _pyplot()
    targets = {name: r for name, r in doc["targets"].items()
               if all(k in r for k, _ in PANELS)}
    if not targets:
        raise ValueError("no target has stall figures: run bench/relay.py --only stalls --json")
    names = list(targets)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.4))
    for ax, (key, title) in zip(axes, PANELS, strict=True):
        values = [float(targets[n][key]) for n in names]
        bars = ax.bar(names, values, color=[_GATEWAY if n.startswith("gateway") else _REFERENCE
                                            for n in names])
        ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.suptitle(f"Relay under paced streams ({doc.get('started', '')}, "
                 f"{doc.get('cpu', '')})", fontsize=10)
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "relay-stalls.svg", out / "relay-stalls.png"]
    fig.savefig(written[0], metadata={"Date": None})
    fig.savefig(written[1], dpi=110, metadata={"Software": None})
    plt.close(fig)
    return written


def _color(name: str) -> str:
    if name.startswith("vllm-router"):
        return _PEER
    if name in ("oracle", "partition"):
        return _REFERENCE
    return _GATEWAY


def _workloads(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    workloads = {w: d for w, d in doc.get("workloads", {}).items() if d.get("results")}
    if not workloads:
        raise ValueError("no workload has results: run bench/routing.py --json")
    return workloads


def _params_line(params: dict[str, Any], keys: tuple[str, ...]) -> str:
    return ", ".join(f"{k}={params[k]}" for k in keys if params.get(k) is not None)


def cache_state(doc: dict[str, Any]) -> str:
    """The cache state a routing run's gateways scored from, by its ``args``.

    Returns:
        :data:`EXACT` when the run had ``--kv-events`` and ``--prompt-format tokens`` (exact
        matching needs the prompt's token ids: chat prompts stay on the estimate), else
        :data:`ESTIMATE`.
    """
    args = doc.get("args") or {}
    exact = bool(args.get("kv_events")) and args.get("prompt_format") == "tokens"
    return EXACT if exact else ESTIMATE


def _runs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """``(cache state, workloads with results)`` of each run, in the order given.

    Raises:
        ValueError: A run has no workload with results, or two runs have the same cache state.
    """
    runs = [(cache_state(doc), _workloads(doc)) for doc in docs]
    states = [state for state, _ in runs]
    if len(set(states)) != len(states):
        raise ValueError(f"two --routing runs of the same cache state: {states}; give one "
                         "without --kv-events and one with --kv-events --prompt-format tokens")
    return runs


def routing_ttft(docs: list[dict[str, Any]], out: Path) -> Path:
    """Draw TTFT p50/p90/p99 per strategy of routing benchmark runs, one panel per workload
    (columns) and run (rows, labelled with its cache state; rows of several pods left out:
    :func:`routing_pods`); the file written.

    Raises:
        ValueError: A run has no workload with results, or two share a cache state.
    """
    plt = _pyplot()
    runs = _runs(docs)
    cols = max(len(w) for _, w in runs)
    fig, axes = plt.subplots(len(runs), cols, figsize=(5.2 * cols, 3.9 * len(runs)),
                             squeeze=False)
    for row, (state, workloads) in enumerate(runs):
        for ax in axes[row][len(workloads):]:
            ax.set_visible(False)
        for ax, (workload, data) in zip(axes[row], workloads.items(), strict=False):
            rows = {n: r for n, r in data["results"].items() if not _PODS.match(n)}
            names = list(rows)
            width = 0.27
            for k, (key, label, alpha) in enumerate((("ttft_p50_s", "p50", 1.0),
                                                     ("ttft_p90_s", "p90", 0.6),
                                                     ("ttft_p99_s", "p99", 0.3))):
                xs = [i + (k - 1) * width for i in range(len(names))]
                bars = ax.bar(xs, [float(rows[n][key]) for n in names], width,
                              color=[_color(n) for n in names], alpha=alpha, label=label)
                if key == "ttft_p50_s":
                    ax.bar_label(bars, fmt="%.2f", fontsize=7)
            ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=8)
            ax.set_ylabel("TTFT (s)", fontsize=9)
            params = data.get("params", {})
            line = _params_line(params, ("replicas", "rate_rps", "requests"))
            ax.set_title(f"{workload}, gateway cache state: {state}\n({line})", fontsize=9)
            ax.legend(fontsize=7, title="bars: p50, p90, p99", title_fontsize=7)
    fig.suptitle("Routing: TTFT per strategy (blue: gateway, red: vllm-router, grey: "
                 "client-side references)", fontsize=10)
    fig.tight_layout()
    path = _save_svg(fig, out / "routing-ttft.svg")
    plt.close(fig)
    return path


def _pod_series(results: dict[str, Any]) -> dict[str, dict[int, dict[str, Any]]]:
    """``strategy -> pods -> row`` of one workload's results (``NAME@Npods`` and ``NAME``)."""
    series: dict[str, dict[int, dict[str, Any]]] = {}
    for name, row in results.items():
        m = _PODS.match(name)
        if m:
            series.setdefault(m["name"], {})[int(m["n"])] = row
    for name in series:
        if name in results:
            series[name][1] = results[name]
    return series


def routing_pods(docs: list[dict[str, Any]], out: Path) -> Path | None:
    """Draw TTFT p50 and hit ratio of each gateway strategy through one pod and through N
    (rows ``NAME@Npods``), the runs' cache states side by side (blue: exact, ochre: estimate;
    lighter: more pods); the file written, or ``None`` when no run had such rows.

    Raises:
        ValueError: A run has no workload with results, or two share a cache state.
    """
    # workload -> [(cache state, strategy -> pods -> row)], workloads in first-seen order.
    panels: dict[str, list[tuple[str, dict[str, dict[int, dict[str, Any]]]]]] = {}
    for state, workloads in _runs(docs):
        for workload, data in workloads.items():
            series = _pod_series(data["results"])
            if series:
                panels.setdefault(workload, []).append((state, series))
    if not panels:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(2, len(panels), figsize=(5.4 * len(panels), 5.8), squeeze=False)
    for col, (workload, runs) in enumerate(panels.items()):
        names = list(dict.fromkeys(s for _, series in runs for s in series))
        bars_of = [(state, series, n) for state, series in runs
                   for n in sorted({n for s in series.values() for n in s})]
        width = 0.8 / len(bars_of)
        for row_i, (key, label, fmt) in enumerate((("ttft_p50_s", "TTFT p50 (s)", "%.3f"),
                                                   ("hit_ratio", "prefix-cache hit ratio",
                                                    "%.2f"))):
            ax = axes[row_i][col]
            for k, (state, series, n) in enumerate(bars_of):
                xs = [i + (k - (len(bars_of) - 1) / 2) * width for i in range(len(names))]
                values = [float(series[s][n][key]) if n in series.get(s, {}) else 0.0
                          for s in names]
                bars = ax.bar(xs, values, width, label=f"{n} pod{'s' * (n > 1)}, {state}",
                              color=_GATEWAY if state == EXACT else _ESTIMATE_COLOR,
                              alpha=1.0 if n == 1 else 0.45)
                ax.bar_label(bars, fmt=fmt, fontsize=6)
            ax.set_xticks(range(len(names)), names, fontsize=8)
            ax.set_ylabel(label, fontsize=9)
            if row_i == 0:
                ax.set_title(workload, fontsize=9)
    # One legend for every panel, under them (inside a panel it would cover bars).
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=8)
    fig.suptitle("Routing through one gateway pod and through several (round-robin front), "
                 "by the gateways' cache state", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    path = _save_svg(fig, out / "routing-pods.svg")
    plt.close(fig)
    return path


def flow_grid(doc: dict[str, Any], out: Path, name: str = "flow-grid.svg") -> Path:
    """Draw the flow-control grid of one ``bench/flow_grid.py`` run; the file written.

    Args:
        doc: The run's JSON (:func:`merge_grid_runs` for a run made of several invocations).
        out: Output directory.
        name: File name of the SVG in ``out``.

    Raises:
        ValueError: The JSON has no grid point, or no arm measured at every point.
    """
    points = doc.get("points") or []
    if not points:
        raise ValueError("no grid point: run bench/flow_grid.py --json")
    plt = _pyplot()
    params = doc.get("params", {})
    target = float(params.get("target", 1.5))
    labels = [f"{p['batch_prompt']}/{p['batch_output']}\n{p['interactive_rps']:g} req/s"
              for p in points]
    xs = list(range(len(points)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    from matplotlib.patches import Patch

    # Each arm that every point measured is drawn (``--phases`` may leave fc out): fc, and
    # with ``--reserve`` the fc-reserve arms beside it.
    k = params.get("reserve")
    candidates = [
        ("ttft_ratio", "batch_ratio", "pass", "with flow control", 1.0),
        ("ttft_ratio_reserve", "batch_ratio_reserve", "pass_reserve",
         f"with flow control and a reserve of {k}", 0.55),
        ("ttft_ratio_lower", "batch_ratio_lower", "pass_lower",
         f"with a reserve of {k}, lower_in_flight {params.get('reserve_lower')}", 0.7),
        ("ttft_ratio_busy", "batch_ratio_busy", "pass_busy",
         f"with a reserve of {k}, lower_in_flight {params.get('reserve_lower')}, "
         f"lower_busy_s {params.get('reserve_busy_s')}", 0.85),
    ]
    arms = [arm for arm in candidates if all(arm[0] in p for p in points)]
    if not arms:
        raise ValueError("no arm measured at every grid point (fc, fc-reserve...)")
    width = 0.8 / (len(arms) + 1)
    handles = []
    for n, (ttft, _batch, _ok, label, alpha) in enumerate(arms):
        offset = (n - len(arms) / 2) * width
        bars = left.bar([x + offset for x in xs], [p[ttft] for p in points], width,
                        color=[_GATEWAY if p[ttft] <= target else "#cf222e" for p in points],
                        alpha=alpha)
        left.bar_label(bars, fmt="%.2f", fontsize=6)
        handles += [Patch(color=_GATEWAY, alpha=alpha, label=f"{label}, target met"),
                    Patch(color="#cf222e", alpha=alpha, label=f"{label}, missed")]
    left.bar([x + (len(arms) / 2) * width for x in xs],
             [p["ttft_ratio_no_fc"] for p in points], width, color=_REFERENCE)
    left.legend(handles=[*handles, Patch(color=_REFERENCE, label="without flow control")],
                fontsize=6, loc="upper left")
    left.axhline(target, color="black", linestyle="--", linewidth=1)
    left.text(len(points) - 0.5, target * 1.08, f"target {target:g}x", ha="right", fontsize=8)
    left.set_yscale("log")
    left.set_ylabel("interactive p99 TTFT / unloaded", fontsize=9)
    bwidth = 0.8 / len(arms)
    for n, (_ttft, batch, _ok, _label, alpha) in enumerate(arms):
        offset = (n - (len(arms) - 1) / 2) * bwidth
        ratio = right.bar([x + offset for x in xs], [p[batch] for p in points], bwidth,
                          color=[_GATEWAY if p[batch] >= p["share"] else "#cf222e"
                                 for p in points], alpha=alpha)
        right.bar_label(ratio, labels=[f"{p[batch]:.2f}" if p[batch] == p[batch]
                                       else "no batch\ntokens" for p in points], fontsize=7)
    share = points[0]["share"]
    right.axhline(share, color="black", linestyle="--", linewidth=1)
    right.text(len(points) - 0.5, share * 1.04, f"configured share {share:.2f}", ha="right",
               fontsize=8)
    right.set_ylabel("batch tokens/s with flow control / without", fontsize=9)
    for ax in (left, right):
        ax.set_xticks(xs, labels, fontsize=7)
        ax.set_xlabel("batch prompt/output tokens, interactive rate", fontsize=8)
    verdicts = "; ".join(f"{sum(1 for p in points if p[ok])} of {len(points)} points pass"
                         + ("" if ok == "pass" else " with the reserve")
                         for _t, _b, ok, _l, _a in arms)
    keys = ("replicas", "profile", "time_scale", "strategy", "long_prefill_token_threshold",
            "scheduling_policy", "min_samples")
    run = f"run of {params['started']}: " if params.get("started") else ""
    setup = textwrap.fill(f"({_params_line(params, keys)}, batch in_flight "
                          f"{params.get('batch_in_flight')} of {params.get('max_num_seqs')})",
                          width=140)
    fig.suptitle(f"Flow control over the grid, {run}{verdicts}\n{setup}", fontsize=9)
    fig.tight_layout()
    path = _save_svg(fig, out / name)
    plt.close(fig)
    return path


GRID_SETUP = ("replicas", "profile", "time_scale", "max_num_seqs", "batch_in_flight",
              "strategy", "long_prefill_token_threshold", "scheduling_policy", "reserve",
              "reserve_lower", "reserve_busy_s", "target")
"""Parameters that every invocation of one grid run must share (:func:`merge_grid_runs`)."""


def merge_grid_runs(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One grid run from several ``bench/flow_grid.py --json`` invocations (one point each).

    Points are concatenated in the order given; the parameters are the first invocation's,
    with ``started`` the earliest and ``ended`` the latest (``YYYY-MM-DD HH:MM UTC`` strings
    sort as times) and ``min_samples`` the smallest.

    Raises:
        ValueError: The invocations differ in a :data:`GRID_SETUP` parameter (naming it).
    """
    if len(docs) == 1:
        return docs[0]
    first = docs[0].get("params", {})
    for n, doc in enumerate(docs[1:], start=2):
        params = doc.get("params", {})
        for key in GRID_SETUP:
            if params.get(key) != first.get(key):
                raise ValueError(f"--grid #{n}: {key} is {params.get(key)!r}, the first run's "
                                 f"is {first.get(key)!r}: not one grid run")
    params = dict(first)
    stamps = [d.get("params", {}) for d in docs]
    if all(p.get("started") for p in stamps):
        params["started"] = min(p["started"] for p in stamps)
    if all(p.get("ended") for p in stamps):
        params["ended"] = max(p["ended"] for p in stamps)
    samples = [p["min_samples"] for p in stamps if "min_samples" in p]
    if samples:
        params["min_samples"] = min(samples)
    return {"params": params, "points": [p for d in docs for p in d.get("points") or []]}


def _load(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a JSON object")
    return doc


def main(argv: list[str] | None = None) -> int:
    """Parse the flags and draw; exit status (2 on unusable input or no input)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relay", type=Path, help="bench/relay.py --json output")
    ap.add_argument("--routing", type=Path, action="append", default=[],
                    help="bench/routing.py --json output (repeat: one run without and one "
                         "with --kv-events --prompt-format tokens, drawn side by side)")
    ap.add_argument("--grid", type=Path, action="append", default=[],
                    help="bench/flow_grid.py --json output (repeat: one run made of several "
                         "invocations, drawn as one grid)")
    ap.add_argument("--grid-svg", default="flow-grid.svg",
                    help="file name of the grid's SVG in --out")
    ap.add_argument("--out", type=Path, default=Path("docs/plots"), help="output directory")
    args = ap.parse_args(argv)
    if not (args.relay or args.routing or args.grid):
        ap.error("give at least one of --relay, --routing, --grid")
    try:
        relay = _load(args.relay) if args.relay else None
        grid = merge_grid_runs([_load(path) for path in args.grid]) if args.grid else None
        routing = [_load(path) for path in args.routing]
        written: list[Path | None] = []
        if relay is not None:
            written += relay_stalls(relay, args.out)
        if routing:
            written += [routing_ttft(routing, args.out), routing_pods(routing, args.out)]
        if grid is not None:
            written.append(flow_grid(grid, args.out, args.grid_svg))
        for path in written:
            if path is not None:
                print(path)
    except (OSError, ValueError, KeyError) as exc:
        print(f"plots: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
