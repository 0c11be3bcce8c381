"""Ctrl-C / SIGTERM stop a ``weights`` command: never exit 0, say so, leave nothing half-visible.

Each child gets the default SIGINT/SIGTERM/SIGHUP dispositions from the test itself
(``tests.conftest.default_signals``), so these tests pass however the suite is started (``nohup``,
``pytest &``, ``setsid``). The signal is sent by the child to itself at a known point (after the
n-th call of a function), so nothing depends on timing.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from tests.hub_fixtures import MINILM, SHARDED, HubServer
from tests.weights.cli_util import run_cli, run_interrupted
from tests.weights.test_weights_verify import lock_dir
from weights import Lockfile


@pytest.fixture
def model(tmp_path: Path, minilm_snapshot: Path) -> tuple[Path, Path]:
    """A small MiniLM copy (no 90 MB weights) and its lockfile."""
    root = tmp_path / "model"
    shutil.copytree(minilm_snapshot, root, ignore=shutil.ignore_patterns("model.safetensors"))
    lock = tmp_path / "weights.lock"
    Lockfile(entries=(lock_dir(root, MINILM),)).save(lock)
    return root, lock


def _one_line(stderr: str, sig: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines == [f"weights: error [interrupted]: interrupted by {sig}; nothing "
                     "half-written was left or made visible (hint: rerun the command to "
                     "resume)"], stderr


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_interrupted_verify_fails_with_the_signal(model: tuple[Path, Path], sig: str) -> None:
    root, lock = model
    res = run_interrupted("weights.verify", (), "check_file", sig,
                          ["verify", str(root), "--lock", str(lock)])
    # Ended by the signal itself: a shell sees 128 + N, a Python parent -N. Never 0.
    assert res.returncode == 128 + getattr(signal, sig), res.stderr
    _one_line(res.stderr, sig)
    assert res.stdout == ""


@pytest.mark.parametrize(("sig", "status"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_shell_sees_130_and_143(model: tuple[Path, Path], sig: str, status: int) -> None:
    root, lock = model
    res = run_interrupted("weights.verify", (), "check_file", sig,
                          ["verify", str(root), "--lock", str(lock)], shell_status=True)
    # ... so `weights verify && deploy` does not deploy.
    assert res.stdout.splitlines()[-1] == f"status={status}", res.stdout + res.stderr


def test_interrupted_json_is_one_document(model: tuple[Path, Path]) -> None:
    root, lock = model
    res = run_interrupted("weights.verify", (), "check_file", "SIGINT",
                          ["verify", str(root), "--lock", str(lock), "--json"])
    assert res.returncode == 128 + signal.SIGINT
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["interrupted"] is True and doc["signal"] == "SIGINT"
    assert doc["error"]["code"] == "interrupted"


def test_uninterrupted_verify_still_exits_0(model: tuple[Path, Path]) -> None:
    root, lock = model
    res = run_cli(["verify", str(root), "--lock", str(lock)])
    assert res.returncode == 0, res.stderr


def test_interrupted_pin_leaves_the_lockfile_unchanged(hub_server: HubServer,
                                                       tmp_path: Path) -> None:
    lock = tmp_path / "weights.lock"
    assert run_cli(["pin", SHARDED, "--lock", str(lock)], endpoint=hub_server.url).returncode == 0
    before = lock.read_bytes()
    res = run_interrupted("weights.hub", ("HubClient",), "snapshot", "SIGTERM",
                          ["pin", MINILM, "--lock", str(lock)], after=1,
                          endpoint=hub_server.url)
    assert res.returncode == 128 + signal.SIGTERM, res.stderr
    _one_line(res.stderr, "SIGTERM")
    assert lock.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.lock"]  # no temp file


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_interrupted_sign_writes_no_signature(model: tuple[Path, Path], tmp_path: Path,
                                              sig: str) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    root, _ = model
    key = tmp_path / "key.pem"
    key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    out = tmp_path / "sigs"
    out.mkdir()
    res = run_interrupted("weights.signing", (), "sha256_file", sig,
                          ["sign", str(root), "--key", str(key), "--out", str(out / "model.sig"),
                           "--quiet"])
    assert res.returncode == 128 + getattr(signal, sig), res.stderr
    _one_line(res.stderr, sig)
    assert list(out.iterdir()) == []
