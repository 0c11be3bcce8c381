"""A local path that does not exist yet is reported as missing, not looked up on the hub.

Walking docs/operator-guide.md on a fresh clone, ``weights plan model/config.json`` before the
model was copied into ``model/`` said ``cannot reach the hub at https://huggingface.co`` about
``model/config.json`` (taken for a repo id ``model`` / ``config.json``): the wrong problem and
the wrong hint on an air-gapped machine. A hub ``ORG/NAME`` still goes to the hub.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.weights.cli_util import run_cli
from weights.cli_extra import is_repo_id


@pytest.mark.parametrize("command", ["plan", "size"])
@pytest.mark.parametrize("target", ["model/config.json", "model/sub"])
def test_a_missing_local_path_is_missing_not_a_hub_error(
    tmp_path: Path, command: str, target: str,
) -> None:
    if target == "model/sub":
        (tmp_path / "model").mkdir()
    res = run_cli([command, target, "--estimate"], cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    assert f"weights: error [target_not_found]: {target}: no such file or directory" in res.stderr
    assert "copy the files there first" in res.stderr
    assert "hub" not in res.stderr.split("(hint:")[0]


def test_what_counts_as_a_repo_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "here").mkdir()
    assert is_repo_id("meta-llama/Llama-3.1-8B-Instruct")
    assert is_repo_id("org/name.v2")
    for local in ("model/config.json", "here/x", "./org/name", "/abs/path", "a/b/c", "name"):
        assert not is_repo_id(local), local
