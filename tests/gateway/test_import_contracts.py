"""The import contracts of pyproject.toml (``make lint``) hold, and fail on a planted import.

The planted imports go into a copy of the packages in a temporary directory, never into the
work tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "policy", "weights", "airgap", "vllm_sim", "clishell")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _contracts() -> dict[str, str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {c["id"]: c["name"] for c in config["contracts"]}


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(root / "pyproject.toml")],
        cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False,
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("contracts")
    shutil.copy2(ROOT / "pyproject.toml", root / "pyproject.toml")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, root / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


def test_the_work_tree_keeps_every_contract() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_core_contract_names_every_gateway_core_module() -> None:
    # A new gateway module must be added to the contract, or a core could import it unseen.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (cores,) = [c for c in config["contracts"] if c["id"] == "sub-package-cores"]
    modules = {f"gateway.{p.stem}" for p in (ROOT / "gateway").glob("*.py")
               if p.stem != "__init__"}
    packages = {f"gateway.{p.name}" for p in (ROOT / "gateway").iterdir()
                if (p / "__init__.py").is_file()}
    core = modules | (packages - set(cores["source_modules"]))
    assert core == set(cores["forbidden_modules"])


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("policy/model.py", "import gateway.errors", "nothing-imports-gateway"),
        ("weights/lockfile.py", "import policy", "policy-weights-independent"),
        ("airgap/pack.py", "import policy", "airgap-imports-only-weights"),
        ("gateway/routing.py", "import weights", "gateway-imports-only-policy"),
        ("vllm_sim/app.py", "import weights", "simulator-is-a-leaf"),
        ("gateway/audit/writer.py", "import gateway.errors", "sub-package-cores"),
        ("gateway/quotas/limiter.py", "import gateway.relay.records", "sub-package-cores"),
        ("gateway/keystore/cache.py", "import gateway.config.settings", "sub-package-cores"),
        ("clishell/errors.py", "import weights", "cli-shell-is-a-leaf"),
        ("gateway/flow/queues.py", "import gateway.routing", "sub-package-cores"),
    ],
)
def test_a_planted_wrong_import_breaks_its_contract(
    copy: Path, module: str, planted: str, contract: str
) -> None:
    """``contract``: the id of the contract the planted import breaks."""
    target = copy / module
    original = target.read_text()
    target.write_text(original + f"\n{planted}  # planted by the test\n")
    try:
        result = _lint(copy)
    finally:
        target.write_text(original)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{_contracts()[contract]} BROKEN" in result.stdout, result.stdout
    assert "planted by the test" not in target.read_text()
