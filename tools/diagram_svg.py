#!/usr/bin/env python3
"""Render a diagram source (YAML: zones, components, edges) to a small, byte-stable SVG.

    python3 tools/diagram_svg.py                 # docs/diagrams/*.yaml -> *.svg
    python3 tools/diagram_svg.py --check         # exit 1 if an SVG is not current

Zones (trust boundaries) are dashed columns, left to right; components are boxes stacked in
their zone; an edge is a line with an arrow head from one box's side to the other's, its label
at the middle. No dependency beyond PyYAML; the output depends only on the source.
"""

from __future__ import annotations

import argparse
import sys
from html import escape
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DIAGRAMS = ROOT / "docs" / "diagrams"
ZONE_W, ZONE_GAP, BOX_W, BOX_H, BOX_GAP, TOP = 230, 40, 190, 54, 22, 90


def render(doc: dict[str, Any]) -> str:
    """The SVG text of one diagram source document."""
    boxes: dict[str, tuple[float, float]] = {}
    parts: list[str] = []
    rows = max(len(z["components"]) for z in doc["zones"])
    height = TOP + rows * (BOX_H + BOX_GAP) + 30
    width = len(doc["zones"]) * (ZONE_W + ZONE_GAP) + ZONE_GAP
    for i, zone in enumerate(doc["zones"]):
        x = ZONE_GAP + i * (ZONE_W + ZONE_GAP)
        parts.append(f'<rect x="{x}" y="50" width="{ZONE_W}" height="{height - 60}" rx="8" '
                     'fill="#f6f8fa" stroke="#57606a" stroke-dasharray="6 4"/>')
        parts.append(f'<text x="{x + ZONE_W / 2}" y="72" text-anchor="middle" '
                     f'font-weight="bold">{escape(zone["label"])}</text>')
        for j, comp in enumerate(zone["components"]):
            bx, by = x + (ZONE_W - BOX_W) / 2, TOP + j * (BOX_H + BOX_GAP)
            boxes[comp["id"]] = (bx, by)
            parts.append(f'<rect x="{bx}" y="{by}" width="{BOX_W}" height="{BOX_H}" rx="6" '
                         'fill="#ffffff" stroke="#0969da"/>')
            parts.append(f'<text x="{bx + BOX_W / 2}" y="{by + 22}" text-anchor="middle">'
                         f'{escape(comp["label"])}</text>')
            parts.append(f'<text x="{bx + BOX_W / 2}" y="{by + 40}" text-anchor="middle" '
                         f'font-size="11" fill="#57606a">{escape(comp.get("note", ""))}</text>')
    for edge in doc["edges"]:
        (ax, ay), (bx, by) = boxes[edge["from"]], boxes[edge["to"]]
        if abs(ax - bx) < 1:  # same zone: down the middle
            x1, y1, x2, y2 = ax + BOX_W / 2, ay + BOX_H, bx + BOX_W / 2, by
        else:
            left = ax < bx
            x1, y1 = (ax + BOX_W if left else ax), ay + BOX_H / 2
            x2, y2 = (bx if left else bx + BOX_W), by + BOX_H / 2
        parts.append(f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#24292f" '
                     'marker-end="url(#arrow)"/>')
        if edge.get("label"):
            parts.append(f'<text x="{(x1 + x2) / 2}" y="{(y1 + y2) / 2 - 5}" '
                         f'text-anchor="middle" font-size="11">{escape(edge["label"])}</text>')
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13">\n'
            '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
            'fill="#24292f"/></marker></defs>\n'
            f'<title>{escape(doc["title"])}</title>\n'
            f'<text x="{width / 2}" y="30" text-anchor="middle" font-size="16" '
            f'font-weight="bold">{escape(doc["title"])}</text>\n')
    return head + "\n".join(parts) + "\n</svg>\n"


def main(argv: list[str] | None = None) -> int:
    """Regenerate (or with ``--check`` compare) every docs/diagrams/*.svg; exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if an SVG is stale")
    args = ap.parse_args(argv)
    stale = []
    for source in sorted(DIAGRAMS.glob("*.yaml")):
        svg = render(yaml.safe_load(source.read_text(encoding="utf-8")))
        target = source.with_suffix(".svg")
        if args.check:
            if not target.is_file() or target.read_text(encoding="utf-8") != svg:
                stale.append(target)
        else:
            target.write_text(svg, encoding="utf-8")
    for target in stale:
        print(f"diagram_svg: {target.relative_to(ROOT)} is stale; run python3 "
              "tools/diagram_svg.py", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
