"""docs/operator-guide.md, run as printed.

Every ``sh`` block of the guide, in order, in one ``bash -euo pipefail`` run from the checkout
with ``HOME`` in a temporary directory; the model directory the guide works on is a stand-in
(the real Llama 3.1 8B ``config.json`` shape from tests/weights/configs and a small
safetensors file). ``console`` blocks (vLLM on a GPU server, ``helm install`` into a cluster,
the audit log of a running gateway) are the guide's own statement of what this does not run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "operator-guide.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", GUIDE.read_text(), re.S | re.M)


def test_the_guide_covers_the_first_day_in_order() -> None:
    script = "\n".join(_blocks("sh"))
    order = ["weights plan", "weights lock", "weights sign", "airgap pack", "airgap verify",
             "airgap unpack", "helm\" template", "gateway preflight", "gateway keys new"]
    positions = [script.index(step) for step in order]
    assert positions == sorted(positions), order


def test_the_guide_says_how_to_install_what_it_uses() -> None:
    """A newcomer on a fresh clone has no .venv/ and no .tools/bin/helm: the guide installs
    both with targets that exist (``make -n`` resolves them without running anything), and
    says where ``model/`` comes from before the first command reads it."""
    consoles = "\n".join(_blocks("console"))
    for target in ("install-runtime", "helm"):
        assert f"make {target}" in consoles, target
        dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True,
                             timeout=60, check=False)
        assert dry.returncode == 0, dry.stderr
    text = GUIDE.read_text()
    assert text.index("in `model/`") < text.index("weights plan model/config.json")


def test_the_guide_runs_as_printed(tmp_path: Path) -> None:
    helm = ROOT / ".tools" / "bin" / "helm"
    if not helm.is_file():
        pytest.fail(".tools/bin/helm is missing: run `make tools` (CI does)")
    site = tmp_path / "sg-site"
    (site / "model").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "weights" / "configs" / "llama-3.1-8b.json",
                site / "model" / "config.json")
    (site / "model" / "model.safetensors").write_bytes(os.urandom(200_000))
    script = "set -euo pipefail\n" + "\n".join(_blocks("sh"))
    env = {**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    env.pop("SG", None)
    run = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "What to run: vllm serve MODEL" in run.stdout
    assert "PASS: " in run.stdout  # the pre-flight
    assert re.search(r"PASS +weights\.locked-signed", run.stdout), run.stdout[-3000:]
    assert (site / "model.sig").is_file() and (site / "hf-cache").is_dir()
    assert not list(ROOT.glob("*.key")) and not (ROOT / "bundle").exists()
