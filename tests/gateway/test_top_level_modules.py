"""gateway/ shows its architecture in its folders: at most 15 modules sit at its top level
(issue 29), every other module lives in the subpackage of its layer or feature."""

from __future__ import annotations

from pathlib import Path

import gateway

MAX_TOP_LEVEL = 15


def test_gateway_has_at_most_15_top_level_modules() -> None:
    top = sorted(p.stem for p in Path(gateway.__file__).parent.glob("*.py")
                 if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL, top
    assert "app" in top and "assembly" in top  # counted where the package really is
