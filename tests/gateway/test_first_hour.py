"""A new user's first hour: the README's steps, the examples and ``make run`` work as printed.

* A fresh shell has no ``gateway`` on its PATH until the README says how (README's "Point it at
  your own vLLM" is walked on loopback by ``test_readme_own_vllm.py``).
* ``gateway keys new`` prints a config line that loads, with the README's ``--data-class``.
* Every file in ``examples/`` passes the validation command its own header names, and every
  gateway config there passes ``gateway check-config``.
* ``make run`` installs the runtime dependencies only (no dev group; of the extras only ``demo``,
  the openai SDK its printed example imports).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gateway.config.loader import parse

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def _shell_env() -> dict[str, str]:
    """The test's environment without the checkout's venv on PATH (a user's fresh shell)."""
    venv_bin = str(REPO / ".venv" / "bin")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and Path(p).resolve() != Path(venv_bin).resolve()]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "VLLM_KEY")}
    env["PATH"] = os.pathsep.join(path)
    return env


def _bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=_shell_env(),
                          capture_output=True, text=True, timeout=180, check=False)


def _user_dir(tmp_path: Path) -> Path:
    """A directory that looks like the checkout to relative README paths (.venv, examples)."""
    home = tmp_path / "checkout"
    home.mkdir()
    (home / ".venv").symlink_to(REPO / ".venv")
    (home / "examples").symlink_to(REPO / "examples")
    (home / "helm").symlink_to(REPO / "helm")  # the pre-flight renders the chart (-f values)
    (home / ".tools").symlink_to(REPO / ".tools")  # with the pinned helm
    return home


def test_fresh_shell_has_no_gateway_on_path(tmp_path: Path) -> None:
    """The premise of the README test: without activation the command is not found."""
    proc = _bash("gateway --help", tmp_path)
    assert proc.returncode == 127, proc.stdout + proc.stderr


@pytest.mark.parametrize("options", [
    ["--id", "team-a", "--model", "m", "--team", "analytics", "--data-class", "confidential"],
    ["--id", "all-models", "--model", "*"],  # a bare * in the line would be a YAML alias
])
def test_keys_new_config_line_loads(options: list[str]) -> None:
    gateway = REPO / ".venv" / "bin" / "gateway"
    out = subprocess.run([str(gateway), "keys", "new", *options], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    line = out.split("config line (under keys:):\n", 1)[1]
    cfg = yaml.safe_load("models: [{name: m, replicas: [{url: 'http://127.0.0.1:9'}]}]\n"
                         "keys:\n" + line)
    key = parse(cfg).keys[0]
    assert key.id == options[1]
    if "--data-class" in options:
        assert (key.team, key.data_class, key.models) == ("analytics", "confidential", ["m"])
    else:
        assert key.models == ["*"]


def test_keys_new_refuses_an_id_the_config_refuses() -> None:
    gateway = REPO / ".venv" / "bin" / "gateway"
    proc = subprocess.run([str(gateway), "keys", "new", "--id", "bad id", "--model", "m"],
                          capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "--id: must be 1-128 characters" in proc.stderr, proc.stderr
    assert "key:" not in proc.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_the_check_its_header_names(example: Path, tmp_path: Path) -> None:
    header = example.read_text(encoding="utf-8").splitlines()[0]
    match = re.search(r"Validate: (.+)$", header)
    assert match is not None, f"{example.name}: the first line names its validation command"
    proc = _bash(f". .venv/bin/activate\n{match[1]}", _user_dir(tmp_path))
    assert proc.returncode == 0, f"{match[1]}:\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.parametrize("example", [p for p in EXAMPLES
                                     if "models" in yaml.safe_load(p.read_text("utf-8"))],
                         ids=lambda p: p.name)
def test_check_config_accepts_every_example_gateway_config(example: Path) -> None:
    gateway = REPO / ".venv" / "bin" / "gateway"
    proc = subprocess.run([str(gateway), "check-config", "--json", "--config", str(example)],
                          capture_output=True, text=True, timeout=60, check=False,
                          env={**_shell_env(), "VLLM_KEY": "x"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["ok"] is True


def _dry_run(target: str) -> list[str]:
    """The ``uv`` commands ``make TARGET`` would run (``-B``: as on a fresh checkout)."""
    proc = subprocess.run(["make", "-n", "-B", target], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=True)
    return [x for x in proc.stdout.splitlines() if "uv/bin/uv " in x and " tools/uv" not in x]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_installs_runtime_dependencies_only() -> None:
    run = _dry_run("run")
    syncs = [x for x in run if " sync " in x]
    assert len(syncs) == 1, run
    # Runtime only, plus the one extra whose SDK the printed example imports (openai).
    assert "--no-dev" in syncs[0] and "--all-extras" not in syncs[0], syncs
    assert re.findall(r"--extra (\S+)", syncs[0]) == ["demo"], syncs
    assert "--inexact" in syncs[0], "must not strip a development venv made by make install"
    assert not any("testdata" in x for x in run), run
    test = [x for x in _dry_run("test") if " sync " in x]
    assert any("--all-extras" in x and "--no-dev" not in x for x in test), test
