"""``gateway preflight -f values.yaml`` on a machine without helm says so and what to do.

It said "--values needs --chart and a helm binary (--helm)" although the chart has a default:
the operator could not tell that helm itself was missing, nor how to run the check without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_values_without_helm_names_helm_and_the_ways_out(tmp_path: Path) -> None:
    values = ROOT / "tests" / "gateway" / "preflight" / "compliant-values.yaml"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": str(tmp_path)}  # no helm anywhere
    res = subprocess.run([sys.executable, "-m", "gateway.cli", "preflight", "-f", str(values),
                          "--chart", str(ROOT / "helm" / "sovereign-gateway")],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60,
                         check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith("gateway: error [preflight_input]: "), line
    assert "no helm was found (looked for .tools/bin/helm and helm on PATH)" in line
    assert "pass --helm PATH" in line and "--manifests manifests.yaml" in line
    assert f"-f {values}" in line  # the helm template command to run elsewhere, ready to paste
