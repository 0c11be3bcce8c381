"""The shipped ``examples/values-*.yaml`` render and pass the pre-flight, as their headers say.

Each file's header prints the ``helm template`` and ``gateway preflight`` command lines to run
from the checkout; this test runs exactly those lines (real helm from ``.tools/bin``, the real
pre-flight) and requires exit 0. Its ``egress`` section must be what ``policy networkpolicy``
prints for the policy it deploys, so the two cannot drift apart.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import sg_helm as h
import yaml

EXAMPLES = sorted((h.REPO / "examples").glob("values-*.yaml"))


def _header_commands(path: Path) -> list[list[str]]:
    """The command lines in the file's header comment (``#   cmd \\`` continued lines)."""
    commands: list[list[str]] = []
    current = ""
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        body = line[1:].strip()
        if line.startswith("#   ") and (current or body.startswith((".tools/", "gateway "))):
            current += " " + body.removesuffix("\\").strip()
            if not body.endswith("\\"):
                commands.append(shlex.split(current))
                current = ""
    return commands


def test_there_are_examples() -> None:
    assert EXAMPLES, "examples/values-*.yaml missing"


@pytest.mark.parametrize("values", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_values_render_and_pass_the_preflight_as_printed(values: Path) -> None:
    h.require_tool(h.HELM)
    commands = _header_commands(values)
    assert [c[0] for c in commands] == [".tools/bin/helm", "gateway"], commands
    env = {**os.environ, "PYTHONPATH": str(h.REPO)}
    for argv in commands:
        if argv[0] == "gateway":
            argv = [sys.executable, "-m", "gateway.cli", *argv[1:]]
        run = subprocess.run(argv, cwd=h.REPO, env=env, capture_output=True, text=True,
                             timeout=180, check=False)
        assert run.returncode == 0, f"{shlex.join(argv)}:\n{run.stdout}\n{run.stderr}"


@pytest.mark.parametrize("values", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_egress_is_what_the_policy_renders(values: Path) -> None:
    (helm,) = [c for c in _header_commands(values) if c[0] == ".tools/bin/helm"]
    policy = next(a.split("=", 1)[1] for a in helm if a.startswith("policy.document="))
    rendered = subprocess.run(
        [sys.executable, "-m", "policy.cli", "networkpolicy", policy, "--format", "helm-values"],
        cwd=h.REPO, env={**os.environ, "PYTHONPATH": str(h.REPO)}, capture_output=True,
        text=True, timeout=60, check=True).stdout
    assert yaml.safe_load(values.read_text())["egress"] == yaml.safe_load(rendered)["egress"]
