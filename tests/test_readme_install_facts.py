"""README says what ``make test`` installs, as the Makefile and .ci/run do it.

Before, the ``make tools`` row said "the CPU build of PyTorch" although ``make tools`` takes
PyPI's CUDA build unless ``TORCH_INDEX`` names the CPU index, left ``gcc`` out of its Debian
packages, and "needs root" did not say that it runs sudo.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _paragraph() -> str:
    start = README.index("What `make test` installs")
    return README[start:README.index("\n\n", start)]


def _tools_row() -> str:
    return next(line for line in README.splitlines() if line.startswith("| `make tools` |"))


def _debian_packages() -> set[str]:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").replace("\\\n", " ")
    pairs = re.search(r"^DEBIAN_TOOLS := (.*)$", makefile, re.M).group(1).split()  # type: ignore[union-attr]
    pairs += re.search(r"install_debian_tools\.sh (.*)$", ci, re.M).group(1).split()  # type: ignore[union-attr]
    return {p.split(":", 1)[1] for p in pairs}


def test_every_debian_package_is_named_with_root_and_sudo() -> None:
    text = _paragraph()
    for package in sorted(_debian_packages()):
        assert f"`{package}`" in text, package
    assert "root" in text and "sudo" in text
    makefile_pairs = re.search(r"^DEBIAN_TOOLS := (.*)$",
                               (ROOT / "Makefile").read_text(), re.M).group(1)  # type: ignore[union-attr]
    for package in {p.split(":", 1)[1] for p in makefile_pairs.split()}:
        assert f"`{package}`" in _tools_row(), package


def test_the_torch_build_is_the_one_the_makefile_takes() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^TORCH_INDEX\s*\?=\s*$", makefile, re.M), "the default is PyPI alone"
    for text in (_paragraph(), _tools_row()):
        assert "CUDA build" in text and "TORCH_INDEX=https://download.pytorch.org/whl/cpu" in text
    assert "the CPU build of PyTorch" not in README
