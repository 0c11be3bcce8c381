"""The chart README's generated sections are current and every value is documented."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import sg_helm as h
import yaml

TOOL = h.REPO / "tools" / "helm_docs.py"


def _leaves(node: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    if isinstance(node, dict) and node:
        return [leaf for k, v in node.items() for leaf in _leaves(v, (*path, k))]
    return [path]


def test_readme_generated_sections_are_current() -> None:
    proc = subprocess.run([sys.executable, str(TOOL), "--check"], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_every_value_is_documented() -> None:
    values = yaml.safe_load((h.CHART / "values.yaml").read_text(encoding="utf-8"))
    readme = (h.CHART / "README.md").read_text(encoding="utf-8")
    documented = {line.split("`")[1] for line in readme.splitlines() if line.startswith("| `")}
    missing = []
    for leaf in _leaves(values):
        prefixes = {".".join(leaf[:i]) for i in range(1, len(leaf) + 1)}
        if not prefixes & documented:
            missing.append(".".join(leaf))
    assert missing == []


def test_every_value_is_in_the_schema() -> None:
    """values.schema.json forbids unknown keys, so every default must be declared there."""
    res = h.helm("lint", "--strict", str(h.CHART), "--set",
                 "audit.signingKey.existingSecret=k,audit.pseudonymKey.existingSecret=p",
                 "--set-file",
                 f"policy.document={h.POLICY_FILE}")
    assert res.returncode == 0, res.stdout + res.stderr
