"""weights pin against the hub emulator, through the real huggingface_hub client."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.hub_fixtures import GATED, HUB_TOKEN, MINILM, NON_ASCII_PATH, SHARDED, HubServer
from weights import Lockfile
from weights.errors import (
    DigestMismatchError,
    DriftError,
    GatedRepoError,
    LicenseRefusedError,
    RepoNotFoundError,
    RevisionNotFoundError,
)
from weights.hub import HubClient
from weights.pin import pin

MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
NOW = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)


def test_pin_branch_records_commit_digests_licence(hub_server: HubServer, tmp_path: Path,
                                                   minilm_snapshot: Path) -> None:
    lock = tmp_path / "weights.lock"
    client = HubClient(hub_server.url)
    # The Hub accepts any case and reports the canonical spelling.
    result = pin(client, lock, MINILM.lower(), "main", now=NOW)
    repo = hub_server.hub.find(MINILM)
    assert repo is not None
    e = Lockfile.load(lock).entry(MINILM)
    assert e.repo_id == MINILM
    assert e.commit == repo.branches["main"] and len(e.commit) == 40
    assert (e.requested_revision, e.license, e.gated) == ("main", "apache-2.0", False)
    assert e.pinned_at == "2026-11-30T04:00:00Z"
    assert result.written
    st = e.file("model.safetensors")
    assert (st.lfs, st.sha256, st.git_sha1, st.size) == (True, MINILM_SHA256, None, 90868376)
    cfg = e.file("config.json")
    # Regular file: git SHA-1 as the Hub publishes it plus a locally computed sha256.
    assert not cfg.lfs
    from weights import git_blob_sha1, sha256_file

    assert cfg.git_sha1 == git_blob_sha1(minilm_snapshot / "config.json")
    assert cfg.sha256 == sha256_file(minilm_snapshot / "config.json")
    assert {f.path for f in e.files} == {
        p.relative_to(minilm_snapshot).as_posix() for p in minilm_snapshot.rglob("*") if p.is_file()
    }
    # LFS content is never downloaded by pin; regular files are.
    assert hub_server.hub.downloads("model.safetensors") == []
    assert len(hub_server.hub.downloads("/vocab.txt")) == 1


def test_pin_tag_and_sha_and_repin_is_byte_identical(hub_server: HubServer,
                                                     tmp_path: Path) -> None:
    client = HubClient(hub_server.url)
    repo = hub_server.hub.find(MINILM)
    assert repo is not None
    by_tag = tmp_path / "tag.lock"
    pin(client, by_tag, MINILM, "v1.0", now=NOW, include=["*.json"])
    sha = repo.tags["v1.0"]
    by_sha = tmp_path / "sha.lock"
    pin(client, by_sha, MINILM, sha, now=NOW, include=["*.json"])
    t, s = Lockfile.load(by_tag).entry(MINILM), Lockfile.load(by_sha).entry(MINILM)
    assert t.commit == s.commit == sha
    assert (t.requested_revision, s.requested_revision) == ("v1.0", sha)
    assert t.files == s.files
    assert all(f.path.endswith(".json") for f in t.files) and t.get("1_Pooling/config.json")
    # Re-pinning an unchanged revision leaves the file byte-for-byte unchanged.
    before = by_tag.read_bytes()
    later = datetime(2027, 1, 1, tzinfo=UTC)
    res = pin(client, by_tag, MINILM, "v1.0", now=later, include=["*.json"])
    assert not res.written and by_tag.read_bytes() == before


def test_drift_is_shown_and_changes_nothing_without_update(hub_server: HubServer,
                                                           tmp_path: Path) -> None:
    client = HubClient(hub_server.url)
    lock = tmp_path / "weights.lock"
    pin(client, lock, SHARDED, "main", now=NOW)
    before = lock.read_bytes()
    repo = hub_server.hub.find(SHARDED)
    assert repo is not None
    old = repo.branches["main"]
    new = repo.commit({"config.json": b'{"changed": true}\n', "added.txt": b"new\n"},
                      replace=False, message="move main")
    with pytest.raises(DriftError) as exc:
        pin(client, lock, SHARDED, "main", now=NOW)
    drift = exc.value.drift
    assert (drift.old_commit, drift.new_commit) == (old, new)  # type: ignore[attr-defined]
    assert drift.added == ("added.txt",)  # type: ignore[attr-defined]
    assert drift.changed == ("config.json",)  # type: ignore[attr-defined]
    assert lock.read_bytes() == before
    res = pin(client, lock, SHARDED, "main", update=True, now=NOW)
    assert res.written and Lockfile.load(lock).entry(SHARDED).commit == new


def test_sharded_repo_special_files(hub_server: HubServer, tmp_path: Path) -> None:
    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, SHARDED, "main", now=NOW, exclude=["README.md"])
    e = Lockfile.load(lock).entry(SHARDED)
    assert e.file("empty.txt").size == 0
    assert e.file("empty.txt").git_sha1 == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert e.get(NON_ASCII_PATH) is not None
    assert e.get("tokenizer/special_tokens_map.json") is not None
    assert e.get("README.md") is None
    assert e.license == "mit"
    assert NON_ASCII_PATH in lock.read_text(encoding="utf-8")


def test_pin_warns_when_globs_leave_out_indexed_shards(hub_server: HubServer,
                                                      tmp_path: Path) -> None:
    res = pin(HubClient(hub_server.url), tmp_path / "w.lock", SHARDED, now=NOW,
              exclude=["*-00002-of-00002.safetensors"])
    assert res.written
    assert res.warnings == (
        "model.safetensors.index.json names model-00002-of-00002.safetensors, which is not "
        "pinned (vLLM would miss its tensors)",
    )
    full = pin(HubClient(hub_server.url), tmp_path / "full.lock", SHARDED, now=NOW)
    assert full.warnings == ()


def test_allow_license_refuses_other_licences(hub_server: HubServer, tmp_path: Path) -> None:
    lock = tmp_path / "weights.lock"
    client = HubClient(hub_server.url, token=HUB_TOKEN)
    with pytest.raises(LicenseRefusedError, match="llama3"):
        pin(client, lock, GATED, allow_license=["apache-2.0", "mit"])
    assert not lock.exists()
    pin(client, lock, GATED, allow_license=["Llama3"], now=NOW)
    e = Lockfile.load(lock).entry(GATED)
    assert e.gated and e.license == "llama3"


def test_gated_repo_needs_token(hub_server: HubServer, tmp_path: Path) -> None:
    with pytest.raises(GatedRepoError) as exc:
        pin(HubClient(hub_server.url), tmp_path / "w.lock", GATED)
    assert exc.value.code == "gated_repo" and "HF_TOKEN" in (exc.value.hint or "")
    assert not (tmp_path / "w.lock").exists()


def test_unknown_repo_and_revision(hub_server: HubServer, tmp_path: Path) -> None:
    client = HubClient(hub_server.url)
    with pytest.raises(RepoNotFoundError):
        pin(client, tmp_path / "w.lock", "nobody/nothing")
    with pytest.raises(RevisionNotFoundError):
        pin(client, tmp_path / "w.lock", MINILM, "no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        pin(client, tmp_path / "w.lock", MINILM, "f" * 40)
    assert not (tmp_path / "w.lock").exists()


def test_regular_file_checked_against_git_sha1(hub_server: HubServer, tmp_path: Path) -> None:
    # The hub serves other bytes than the git blob it advertises: pin refuses.
    hub_server.hub.corrupt("config.json", offset=3)
    with pytest.raises(DigestMismatchError) as exc:
        pin(HubClient(hub_server.url), tmp_path / "w.lock", SHARDED, include=["config.json"])
    assert exc.value.path == "config.json"
    assert exc.value.expected.startswith("git-sha1:") and exc.value.actual.startswith("git-sha1:")
    assert exc.value.expected != exc.value.actual
    assert not (tmp_path / "w.lock").exists()


def test_cli_pin_json_and_exit_codes(hub_server: HubServer, tmp_path: Path) -> None:
    from tests.weights.cli_util import run_cli

    lock = tmp_path / "weights.lock"
    r = run_cli(["pin", SHARDED, "--lock", str(lock), "--json"], endpoint=hub_server.url)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["written"] and doc["entry"]["repo_id"] == SHARDED
    repo = hub_server.hub.find(SHARDED)
    assert repo is not None
    repo.commit({"x.txt": b"x"}, replace=False)
    r = run_cli(["pin", SHARDED, "--lock", str(lock)], endpoint=hub_server.url)
    assert r.returncode == 1 and "+ x.txt" in r.stderr and "--update" in r.stderr
    r = run_cli(["pin", "nobody/nothing", "--lock", str(lock)], endpoint=hub_server.url)
    assert r.returncode == 2 and "repo_not_found" in r.stderr
