"""weights pull stops reading a file as soon as the hub sends more than the lock's size and
removes what it wrote (tester's finding 08: 200 MB landed on disk for a 23-byte config.json
before the size check refused it)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.hub_fixtures import SHARDED, HubServer
from tests.weights.cli_util import run_cli
from weights import Lockfile
from weights.errors import HubError
from weights.hub import HubClient
from weights.pin import pin
from weights.pull import pull_entry, staging_part

NOW = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)
PAD = 32 * 1024 * 1024


@pytest.mark.parametrize("declare_length", [True, False], ids=["content-length", "chunked"])
def test_oversized_download_is_cut_at_the_locked_size(
        hub_server: HubServer, tmp_path: Path, declare_length: bool) -> None:
    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, SHARDED, now=NOW, include=["config.json"])
    entry = Lockfile.load(lock).entry(SHARDED)
    locked = entry.file("config.json")
    hub_server.hub.pad("config.json", PAD, declare_length=declare_length)
    staging = tmp_path / "staging"
    part = staging_part(staging, entry, locked)
    on_disk: list[int] = []

    def watch(_n: int) -> None:  # after every chunk written: what the part file holds now
        on_disk.append(part.stat().st_size if part.exists() else 0)

    with pytest.raises(HubError) as exc:
        pull_entry(HubClient(hub_server.url), entry, into=tmp_path / "model", staging=staging,
                   progress=watch)
    assert max(on_disk, default=0) <= locked.size  # never one byte past the lock on disk
    assert exc.value.code == "hub_error"
    assert f"lock says {locked.size}; download stopped, partial file removed" in exc.value.message
    assert not part.exists() and not (tmp_path / "model").exists()
    assert len(hub_server.hub.downloads("/config.json")) == 2  # pin's, then one pull: no retry


def test_cli_pull_refuses_and_the_next_pull_completes(hub_server: HubServer,
                                                      tmp_path: Path) -> None:
    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, SHARDED, now=NOW, include=["config.json"])
    hub_server.hub.pad("config.json", PAD)
    r = run_cli(["pull", "--lock", str(lock), "--into", str(tmp_path / "m"), "-q"],
                endpoint=hub_server.url)
    assert sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()) < 64 * 1024
    assert r.returncode == 2 and "download stopped, partial file removed" in r.stderr, r.stderr
    r = run_cli(["pull", "--lock", str(lock), "--into", str(tmp_path / "m"), "-q"],
                endpoint=hub_server.url)
    assert r.returncode == 0, r.stderr


def test_range_read_of_size_and_plan_stops_at_the_bytes_asked(hub_server: HubServer) -> None:
    """``size``/``plan REPO_ID`` read config.json and safetensors headers by Range: a hub that
    answers with more than the range is refused, not read whole into memory."""
    client = HubClient(hub_server.url)
    repo = hub_server.hub.find(SHARDED)
    assert repo is not None
    commit = repo.branches["main"]
    assert client.read_range(SHARDED, commit, "config.json", 0, 8) == b'{\n  "arc'
    hub_server.hub.pad("config.json", PAD)
    with pytest.raises(HubError, match=r"hub sends more than the 8 bytes asked \(bytes 0-7\)"):
        client.read_range(SHARDED, commit, "config.json", 0, 8)
