"""The architecture diagram is generated from its source and shows every component.

``docs/diagrams/architecture.svg`` is what ``tools/diagram_svg.py`` makes of
``architecture.yaml`` (byte for byte), is well-formed SVG, and draws every component and trust
boundary of the source, which names the packages' real parts.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "diagrams" / "architecture.yaml"


def test_the_svg_is_current() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "diagram_svg.py"), "--check"],
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr


def test_the_svg_draws_every_zone_component_and_edge() -> None:
    doc = yaml.safe_load(SOURCE.read_text())
    svg = ET.parse(SOURCE.with_suffix(".svg")).getroot()  # noqa: S314 (our own file)
    ns = "{http://www.w3.org/2000/svg}"
    texts = {t.text for t in svg.iter(f"{ns}text")}
    for zone in doc["zones"]:
        assert zone["label"] in texts
        for comp in zone["components"]:
            assert comp["label"] in texts
    assert len(list(svg.iter(f"{ns}line"))) == len(doc["edges"])
    assert "docs/diagrams/architecture.svg" in (ROOT / "README.md").read_text()
