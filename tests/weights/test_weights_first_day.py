"""The first-day mistakes of ``weights``: each gets a message that says what to do.

``weights lock DIR`` without ``--repo-id`` said ``None is not org/name``; ``weights pin ./dir``
did not point to ``weights lock``; ``weights sign`` replaced an existing ``model.sig`` silently.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.terminal import piped

PY = sys.executable


@pytest.fixture
def model(tmp_path: Path) -> Path:
    m = tmp_path / "model"
    m.mkdir()
    (m / "config.json").write_text("{}")
    (m / "model.safetensors").write_bytes(b"\0" * 1000)
    return m


def test_lock_without_a_name_asks_for_repo_id(model: Path, tmp_path: Path) -> None:
    run = piped([PY, "-m", "weights.cli", "lock", str(model), "--lock", "w.lock"], cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert "None" not in run.stderr, run.stderr
    assert "a model name is needed" in run.stderr and "--repo-id org/name" in run.stderr
    assert not (tmp_path / "w.lock").exists()


def test_lock_with_a_bad_name_names_it(model: Path, tmp_path: Path) -> None:
    run = piped([PY, "-m", "weights.cli", "lock", str(model), "--repo-id", "a/b/c", "--lock",
                 "w.lock"], cwd=tmp_path)
    assert run.returncode == 2
    assert "'a/b/c' is not a model name of the form org/name" in run.stderr, run.stderr


def test_pin_of_a_local_directory_suggests_lock(model: Path, tmp_path: Path) -> None:
    run = piped([PY, "-m", "weights.cli", "pin", "./model", "--lock", "w.lock",
                 "--endpoint", "http://127.0.0.1:9"], cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert "is a local directory" in run.stderr
    assert "weights lock ./model --repo-id org/name" in run.stderr, run.stderr


def test_sign_does_not_replace_a_signature_without_force(model: Path, tmp_path: Path) -> None:
    assert piped([PY, "-m", "weights.cli", "keygen", "--out", "k.pem"],
                 cwd=tmp_path).returncode == 0
    sign = [PY, "-m", "weights.cli", "sign", "model", "--key", "k.pem", "--out", "model.sig"]
    assert piped(sign, cwd=tmp_path).returncode == 0
    first = (tmp_path / "model.sig").read_bytes()
    again = piped(sign, cwd=tmp_path)
    assert again.returncode == 2
    assert "model.sig exists: not replacing a signature" in again.stderr, again.stderr
    assert "--force" in again.stderr
    assert (tmp_path / "model.sig").read_bytes() == first
    forced = piped([*sign, "--force"], cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert "signed 2 files" in forced.stdout


def test_size_and_plan_take_the_same_memory_fraction_flag(tmp_path: Path) -> None:
    """``weights size --utilization`` and ``weights plan --gpu-memory-utilization`` asked the
    same question under two names: both now take vLLM's name (and the old one)."""
    config = Path(__file__).parent / "configs" / "llama-3.1-8b.json"
    for command in ("size", "plan"):
        for flag in ("--gpu-memory-utilization", "--utilization"):
            run = piped([PY, "-m", "weights.cli", command, str(config), "--estimate",
                         flag, "0.5", "--json"], cwd=tmp_path)
            assert run.returncode in (0, 1), (command, flag, run.stderr)
            assert "error" not in run.stderr, (command, flag, run.stderr)
