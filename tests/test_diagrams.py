"""The diagrams are generated from their sources, show every component, and the layers are true.

``docs/diagrams/architecture.svg`` is what ``tools/diagram_svg.py`` makes of
``architecture.yaml`` (byte for byte), is well-formed SVG, and draws every component and trust
boundary of the source, which names the packages' real parts. ``layers.yaml`` names the modules
behind each box: every import between two boxes runs left to right (or down a column), and
every arrow drawn is such an import, read from the code's import statements the way
``tests/test_import_circles.py`` reads them.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

from tests.test_import_circles import import_graph, product_modules

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "diagrams" / "architecture.yaml"
LAYERS = ROOT / "docs" / "diagrams" / "layers.yaml"


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


def _box_of(doc: dict[str, object], modules: set[str]) -> dict[str, str]:
    """Each product module -> the id of the box whose longest ``modules`` entry covers it."""
    entries: dict[str, str] = {}
    for zone in doc["zones"]:  # type: ignore[attr-defined]
        for comp in zone["components"]:
            for entry in comp["modules"]:
                assert entry in modules, f"{comp['id']}: {entry} is not a module or package"
                assert entry not in entries, f"{entry} is named by two boxes"
                entries[entry] = comp["id"]
    owner: dict[str, str] = {}
    for module in modules:
        covering = [e for e in entries if module == e or module.startswith(e + ".")]
        if covering:
            owner[module] = entries[max(covering, key=len)]
    return owner


def test_the_layers_are_the_imports() -> None:
    doc = yaml.safe_load(LAYERS.read_text())
    modules = product_modules(ROOT, ("gateway", "policy"))
    owner = _box_of(doc, set(modules))
    place = {comp["id"]: (i, j) for i, zone in enumerate(doc["zones"])
             for j, comp in enumerate(zone["components"])}
    between: dict[tuple[str, str], list[str]] = {}
    for a, b in import_graph(modules):
        if a in owner and b in owner and owner[a] != owner[b]:
            between.setdefault((owner[a], owner[b]), []).append(f"{a} -> {b}")
    back = {pair: found for pair, found in between.items() if place[pair[0]] >= place[pair[1]]}
    assert not back, back
    drawn = {(edge["from"], edge["to"]) for edge in doc["edges"]}
    assert drawn <= set(between), sorted(drawn - set(between))
