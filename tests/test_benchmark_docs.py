"""docs/benchmarks.md holds the current figures; the history of earlier rounds is in the
changelog; every link into either page lands on a heading that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = {ROOT / "docs" / "benchmarks.md", ROOT / "CHANGELOG.md"}


def _slugs(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    slugs, fence = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#+ (.*)", line)):
            slugs.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return slugs


def test_benchmarks_page_has_no_history_rounds() -> None:
    headings = [line for line in (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
                if line.startswith("#")]
    assert not [h for h in headings if re.search(r"round|before and after", h, re.I)]
    assert "CHANGELOG.md#benchmark-history" in (ROOT / "docs" / "benchmarks.md").read_text()


def test_links_into_the_benchmark_pages_land_on_headings() -> None:
    sources = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for src in sources:
        for target, anchor in re.findall(r"\]\(([^)#\s]+\.md)#([^)\s]+)\)", src.read_text()):
            page = (src.parent / target).resolve()
            if page in PAGES and anchor not in _slugs(page):
                broken.append(f"{src.relative_to(ROOT)}: {target}#{anchor}")
    assert not broken, broken
