#!/usr/bin/env python3
"""Plots of the benchmarks' own JSON output, for docs/benchmarks.md (``make bench-plots``).

    python bench/plots.py --relay RELAY.json --out docs/plots

``RELAY.json`` is what ``bench/relay.py --json`` writes: ``{"started", "cpu", "args",
"targets": {NAME: results}}``. From the paced phase (``--only stalls``) it draws, per target
(the gateway, nginx beside it, the backend direct): the share of stall-free streams (%), the
p99 gap between events (ms) and the relay's CPU per event (µs), one bar chart each, and writes
``relay-stalls.svg`` and ``relay-stalls.png``. The SVG is written without timestamps or random
ids so that regenerating from the same JSON gives the same file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PANELS = (("stall_free_pct", "stall-free streams (%)"),
          ("gap_p99_ms", "p99 gap between events (ms)"),
          ("cpu_us_per_event", "relay CPU per event (µs)"))


def relay_stalls(doc: dict[str, Any], out: Path) -> list[Path]:
    """Draw the paced-phase figures of one relay benchmark run; the files written.

    Raises:
        ValueError: No target has the paced phase's figures (run with ``--only stalls``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    matplotlib.rcParams["svg.hashsalt"] = "sovereign-gateway"  # stable ids in the SVG
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, small
    targets = {name: r for name, r in doc["targets"].items()
               if all(k in r for k, _ in PANELS)}
    if not targets:
        raise ValueError("no target has stall figures: run bench/relay.py --only stalls --json")
    names = list(targets)
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.4))
    for ax, (key, title) in zip(axes, PANELS, strict=True):
        values = [float(targets[n][key]) for n in names]
        bars = ax.bar(names, values, color=["#0969da" if n.startswith("gateway") else "#8c959f"
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


def main(argv: list[str] | None = None) -> int:
    """Parse the flags and draw; exit status (2 on unusable input)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relay", type=Path, required=True, help="bench/relay.py --json output")
    ap.add_argument("--out", type=Path, default=Path("docs/plots"), help="output directory")
    args = ap.parse_args(argv)
    try:
        doc = json.loads(args.relay.read_text(encoding="utf-8"))
        for path in relay_stalls(doc, args.out):
            print(path)
    except (OSError, ValueError, KeyError) as exc:
        print(f"plots: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
