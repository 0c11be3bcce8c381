"""Every relative link of the README, the changelog and docs/ opens: the file exists, and an
anchor (into another page or the same one) lands on a heading of that page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


def _without_code(text: str) -> str:
    """The text outside fenced code blocks (a link there is an example, not a link)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _slugs(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#+ (.*)$", _without_code(page.read_text()), re.M)}


def _links(src: Path) -> list[str]:
    """The relative link targets of ``src`` (``path``, ``path#anchor`` or ``#anchor``)."""
    return [link for link in re.findall(r"\]\(([^)\s]+)\)", _without_code(src.read_text()))
            if not re.match(r"[a-z]+:", link)]


def test_every_relative_link_opens_a_file_and_lands_on_a_heading() -> None:
    broken = []
    for src in SOURCES:
        for link in _links(src):
            path, _, anchor = link.partition("#")
            target = (src.parent / path).resolve() if path else src
            if not target.exists():
                broken.append(f"{src.relative_to(ROOT)}: {link}: no such file")
            elif anchor and target.suffix == ".md" and anchor not in _slugs(target):
                broken.append(f"{src.relative_to(ROOT)}: {link}: no such heading")
    assert not broken, broken
