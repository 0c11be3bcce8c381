"""HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE, or --offline) keeps every weights command off the
network: the hub is never contacted, not even resolved (tester's finding 05: size, pin and plan
sent the repo id to the hub with HF_HUB_OFFLINE=1). Checked in a child process whose audit hook
records and blocks every name lookup and connection."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.weights.cli_util import ROOT
from tests.weights.test_weights_egress import GUARD, model  # noqa: F401 - fixture
from weights import Lockfile


def _guarded(args: list[str], env_extra: dict[str, str]) -> tuple[dict[str, object], str]:
    """Run ``weights ARGS`` under the egress guard; return its record and the CLI's stderr."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_ENDPOINT": "http://192.0.2.1:9",
           "HF_HUB_DISABLE_TELEMETRY": "1", "HOME": str(ROOT / ".nonexistent-home"),
           **env_extra}
    r = subprocess.run([sys.executable, "-c", GUARD, *args], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=120, check=True)
    *lines, last = r.stderr.strip().splitlines()
    return json.loads(last), " ".join(" ".join(lines).split())


@pytest.mark.parametrize("switch", [{"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "true"},
                                    {"TRANSFORMERS_OFFLINE": "1"}, {}])
def test_hub_commands_refuse_offline_before_any_lookup(
        model: tuple[Path, Path, Path, Path], tmp_path: Path,  # noqa: F811
        switch: dict[str, str]) -> None:
    root, lock, _, _ = model
    flag = [] if switch else ["--offline"]
    repo_id = Lockfile.load(lock).entries[0].repo_id
    for args in (
        ["size", "acme/secret-internal-model"],
        ["pin", "acme/secret-internal-model", "--lock", str(tmp_path / "new.lock")],
        ["plan", "acme/secret-internal-model", "--gpu", "h100-sxm"],
        ["plan", repo_id, "--lock", str(lock), "--gpu", "h100-sxm"],  # pinned, read remotely
        ["pull", "--lock", str(lock), "--into", str(tmp_path / "pulled"), "-q"],
    ):
        out, err = _guarded([*args, *flag], switch)
        assert out["events"] == [], (args, out)  # no getaddrinfo, no connect
        assert out["code"] == 2, (args, out, err)
        assert "error [hub_offline]" in err and "offline mode is on (HF_HUB_OFFLINE)" in err, err
    assert not (tmp_path / "new.lock").exists() and not (tmp_path / "pulled").exists()
    assert not any(p.name.startswith(".pulled") for p in tmp_path.iterdir())  # no staging
    # What needs no hub still works offline: a pull whose files are all in place.
    out, _ = _guarded(["pull", "--lock", str(lock), "--into", str(root), "-q", *flag], switch)
    assert out == {"code": 0, "events": [], "loaded": out["loaded"]}


def test_offline_off_does_reach_for_the_hub(tmp_path: Path) -> None:
    """The guard sees the lookup when offline mode is off (the test above means something)."""
    out, _ = _guarded(["size", "acme/secret-internal-model"], {"HF_HUB_OFFLINE": "0"})
    assert out["events"] and out["code"] == 2
