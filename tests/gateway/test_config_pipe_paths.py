"""A config given as a pipe (``--config <(envsubst < gateway.yaml)``) resolves its relative
paths against the directory the command runs in, as the operator wrote them; they were resolved
against ``/dev/fd`` (the pipe's "directory"), so ``api_key_file: vllm-key`` was not found.
A config read from a regular file keeps resolving against the file's own directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.gateway.helpers import config

ROOT = Path(__file__).resolve().parents[2]


def _cfg() -> dict[str, object]:
    cfg = config(["http://127.0.0.1:1"])
    cfg["models"][0]["replicas"] = [  # type: ignore[index]
        {"url": "http://127.0.0.1:1", "api_key_file": "vllm-key"}]
    return cfg


def _check(argv_tail: str, cwd: Path, path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(["bash", "-c", f'exec "$0" -m gateway.cli check-config {argv_tail}',
                           sys.executable, str(path)], capture_output=True, text=True,
                          check=False, env=env, cwd=cwd, timeout=60)


def test_relative_paths_of_a_piped_config_are_the_working_directorys(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    path = conf / "gateway.yaml"
    path.write_text(yaml.safe_dump(_cfg()))
    (tmp_path / "vllm-key").write_text("secret\n")  # next to where the command runs
    res = _check('--config <(cat "$1")', tmp_path, path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert ": OK (listen" in res.stdout


def test_relative_paths_of_a_config_file_are_its_directorys(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    path = conf / "gateway.yaml"
    path.write_text(yaml.safe_dump(_cfg()))
    (tmp_path / "vllm-key").write_text("secret\n")  # not next to the file: refused
    res = _check('--config "$1"', tmp_path, path)
    assert res.returncode != 0 and "vllm-key" in res.stdout + res.stderr
    (conf / "vllm-key").write_text("secret\n")
    assert _check('--config "$1"', tmp_path, path).returncode == 0
