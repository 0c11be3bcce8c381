"""The test lanes: ``make test`` is what CI runs (every test, serially, slowest listed);
``make test-fast`` is the developer lane (pytest-xdist, the slow tests left out).

Both lanes are run here for real on a small slice: the marker selection and the xdist plugin
must work as the Makefile invokes them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _recipe_env(target: str) -> tuple[dict[str, str], list[str]]:
    """The pytest line of a make target: its leading ``NAME=VALUE`` assignments (the
    environment it sets, ``$(CURDIR)`` expanded) and the command."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)+)", text, re.M)
    assert match, f"no make target {target}"
    (line,) = [x.strip() for x in match.group(1).splitlines() if "pytest" in x]
    words = shlex.split(line.replace("$(PY)", sys.executable).replace("$(CURDIR)", str(ROOT)))
    env: dict[str, str] = {}
    while re.fullmatch(r"\w+=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    return env, words


def _recipe(target: str) -> list[str]:
    return _recipe_env(target)[1]


def _options(argv: list[str]) -> list[str]:
    return argv[argv.index("pytest") + 1:]


def test_ci_lane_runs_everything_serially_and_lists_the_slowest() -> None:
    argv = _options(_recipe("test"))
    # Every test of 2 s or more (not only the slowest 25): the basis for marking tests slow.
    assert "--durations=0" in argv and "--durations-min=2" in argv
    assert "-n" not in argv and "-m" not in argv  # every test, one process


def test_fast_lane_uses_xdist_and_leaves_out_slow_tests() -> None:
    argv = _options(_recipe("test-fast"))
    assert argv[argv.index("-n") + 1] == "3" and argv[argv.index("-m") + 1] == "not slow"
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    assert any(re.fullmatch(r"pytest-xdist>=3\.8,<3\.9", d) for d in dev), dev


def test_fast_lane_runs_as_the_makefile_invokes_it_and_skips_bench() -> None:
    env, argv = _recipe_env("test-fast")
    argv = [*argv, "--collect-only", "-q", "tests/bench", "tests/test_test_lanes.py"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tests/bench/" not in done.stdout  # deselected: marked slow
    assert "tests/test_test_lanes.py: 4" in done.stdout


def test_fast_lane_writes_bytecode_outside_the_sources_whatever_the_shell_says() -> None:
    # Without written bytecode every worker rewrites the asserts of every test module at
    # collection and every CLI subprocess compiles the project again.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", **_recipe_env("test-fast")[0]}
    probe = "import json, sys; print(json.dumps([sys.dont_write_bytecode, sys.pycache_prefix]))"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    dont_write, prefix = json.loads(done.stdout)
    assert dont_write is False
    assert prefix is not None and Path(prefix).is_relative_to(ROOT / ".cache"), prefix
