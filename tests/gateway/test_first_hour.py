"""A new user's first hour: the README's steps, the examples and ``make run`` work as printed.

* Every command of README's "Point it at your own vLLM" runs as printed, in a fresh directory, in
  a shell whose PATH does not contain the checkout's ``.venv/bin`` until the README says how.
* ``gateway keys new`` prints a config line that loads, with the README's ``--data-class``.
* Every file in ``examples/`` passes the validation command its own header names, and every
  gateway config there passes ``gateway check-config``.
* ``make run`` installs the runtime dependencies only (no dev group, no extras).
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

from gateway.settings import parse

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
_FENCE = re.compile(r"^ *```(\w+)\n(.*?)^ *```", re.M | re.S)


def _section(title: str) -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def _blocks(section: str) -> list[tuple[str, str]]:
    """``(language, dedented body)`` of each fenced block, in document order."""
    out = []
    for lang, body in _FENCE.findall(section):
        lines = body.splitlines()
        indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
        out.append((lang, "\n".join(x[indent:] for x in lines) + "\n"))
    return out


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
    return home


def test_fresh_shell_has_no_gateway_on_path(tmp_path: Path) -> None:
    """The premise of the README test: without activation the command is not found."""
    proc = _bash("gateway --help", tmp_path)
    assert proc.returncode == 127, proc.stdout + proc.stderr


def test_readme_own_vllm_steps_run_as_printed(tmp_path: Path) -> None:
    section = _section("Point it at your own vLLM")
    blocks = _blocks(section)
    assert [lang for lang, _ in blocks] == ["sh", "sh", "sh", "yaml", "sh"], blocks
    home = _user_dir(tmp_path)
    prelude: list[str] = []  # lines that set up the shell (activation), replayed per block
    digest = None
    for lang, body in blocks:
        if lang == "yaml":
            assert digest is not None, "the key step comes before the config"
            (home / "gateway.yaml").write_text(body.replace("<hex>", digest), encoding="utf-8")
            continue
        for line in body.splitlines():
            command = line.split("  #")[0].strip()
            if not command:
                continue
            if command.startswith("make "):
                target = command.split()[1]
                dry = subprocess.run(["make", "-n", target], cwd=REPO, capture_output=True,
                                     text=True, timeout=60, check=False)
                assert dry.returncode == 0, f"README names make target {target!r}: {dry.stderr}"
                continue
            if command.startswith(". ") or command.startswith("source "):
                prelude.append(command)
                continue
            if " gateway serve " in f" {command} ":
                command += " --help"  # serving would block; the command must exist as printed
            proc = _bash("\n".join([*prelude, command]), home)
            assert proc.returncode == 0, f"{command!r} failed:\n{proc.stdout}\n{proc.stderr}"
            if "keys new" in command:
                digest = _check_key_line(proc.stdout, section)
    assert (home / "audit.key").is_file() and (home / "policy.yaml").is_file()


def _check_key_line(stdout: str, section: str) -> str:
    """The printed config line is the README's ``keys:`` line with the real digest."""
    printed = stdout.split("config line (under keys:):\n", 1)[1].strip()
    digest = re.search(r"sha256: ([0-9a-f]{64})", printed)
    assert digest is not None, stdout
    readme_line = next(x.strip() for x in section.splitlines() if "sha256: <hex>" in x)
    assert printed == readme_line.replace("<hex>", digest[1]), (printed, readme_line)
    return digest[1]


@pytest.mark.parametrize("options", [
    ["--id", "team-a", "--model", "m", "--team", "analytics", "--data-class", "confidential"],
    ["--id", "all-models"],  # models default to ["*"]: a bare * would be a YAML alias
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
    proc = subprocess.run([str(gateway), "keys", "new", "--id", "bad id"], capture_output=True,
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
    assert "--no-dev" in syncs[0] and "--extra" not in syncs[0], syncs
    assert "--inexact" in syncs[0], "must not strip a development venv made by make install"
    assert not any("testdata" in x for x in run), run
    test = [x for x in _dry_run("test") if " sync " in x]
    assert any("--all-extras" in x and "--no-dev" not in x for x in test), test
