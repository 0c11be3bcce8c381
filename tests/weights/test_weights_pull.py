"""weights pull: exact pinned bytes, verified before visible, resumable, plain dir or HF cache."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.hub_fixtures import MINILM, NON_ASCII_PATH, SHARDED, HubServer
from tests.weights.cli_util import ROOT, run_cli
from weights import Lockfile, hf_cache_paths, sha256_file, verify_tree
from weights.errors import CacheLayoutError, DigestMismatchError
from weights.hub import HubClient
from weights.pin import pin
from weights.pull import pull_entry, staging_part

NOW = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def _pinned(hub_server: HubServer, tmp_path: Path, repo_id: str, **kw: object) -> Path:
    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, repo_id, now=NOW, **kw)  # type: ignore[arg-type]
    return lock


def test_pull_plain_dir_is_pinned_commit_even_after_branch_moves(hub_server: HubServer,
                                                                  tmp_path: Path) -> None:
    lock = _pinned(hub_server, tmp_path, SHARDED)
    entry = Lockfile.load(lock).entry(SHARDED)
    repo = hub_server.hub.find(SHARDED)
    assert repo is not None
    repo.commit({"config.json": b"{}\n"}, replace=False)  # main moves after pinning
    dest = tmp_path / "model"
    result = pull_entry(HubClient(hub_server.url), entry, into=dest)
    assert sorted(result.downloaded) == sorted(f.path for f in entry.files)
    assert verify_tree(dest, entry).ok
    assert (dest / NON_ASCII_PATH).is_file() and (dest / "empty.txt").stat().st_size == 0
    # Every download named the commit, never the branch.
    gets = [r for r in hub_server.hub.requests if "/resolve/" in r.path]
    assert gets and all(f"/resolve/{entry.commit}/" in r.path for r in gets)
    assert not any(p.name.endswith(".weights-staging") for p in tmp_path.iterdir())
    # A second pull reuses what is there (verified) and downloads nothing.
    n = len(hub_server.hub.requests)
    again = pull_entry(HubClient(hub_server.url), entry, into=dest)
    assert again.downloaded == [] and len(hub_server.hub.requests) == n


def test_pull_cache_layout_loads_offline_with_huggingface_hub(hub_server: HubServer,
                                                              tmp_path: Path) -> None:
    lock = _pinned(hub_server, tmp_path, MINILM)
    entry = Lockfile.load(lock).entry(MINILM)
    cache = tmp_path / "hub-cache"
    r = run_cli(["pull", "--lock", str(lock), "--cache", str(cache), "-q"],
                endpoint=hub_server.url)
    assert r.returncode == 0, r.stderr
    paths = hf_cache_paths(cache, MINILM)
    assert paths.ref("main").read_text() == entry.commit  # no trailing newline
    link = paths.snapshot(entry.commit) / "model.safetensors"
    assert link.is_symlink() and os.readlink(link) == f"../../blobs/{MINILM_SHA256}"
    cfg_link = paths.snapshot(entry.commit) / "1_Pooling" / "config.json"
    assert os.readlink(cfg_link) == f"../../../blobs/{entry.file('1_Pooling/config.json').git_sha1}"
    assert verify_tree(cache, entry).ok
    # huggingface_hub itself resolves repo id + branch offline from this cache.
    code = (
        "import sys; from huggingface_hub import hf_hub_download, snapshot_download;"
        f"p = hf_hub_download({MINILM!r}, 'model.safetensors', cache_dir=sys.argv[1]);"
        f"s = snapshot_download({MINILM!r}, cache_dir=sys.argv[1]);"
        "print(p); print(s)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_OFFLINE="1", HF_ENDPOINT="http://192.0.2.1:9", HF_HUB_DISABLE_TELEMETRY="1")
    out = subprocess.run([sys.executable, "-c", code, str(cache)], capture_output=True, text=True,
                         env=env, check=True, cwd=ROOT)
    p, s = out.stdout.split()
    assert sha256_file(p) == MINILM_SHA256
    assert Path(s) == paths.snapshot(entry.commit)


def test_pull_resumes_after_connection_drop_mid_file(hub_server: HubServer,
                                                     tmp_path: Path) -> None:
    lock = _pinned(hub_server, tmp_path, MINILM, include=["model.safetensors"])
    entry = Lockfile.load(lock).entry(MINILM)
    # Cut after 30 MB once: the download continues from the exact byte written.
    hub_server.hub.cut_connection("model.safetensors", after_bytes=30_000_000)
    dest = tmp_path / "model"
    pull_entry(HubClient(hub_server.url), entry, into=dest)
    gets = hub_server.hub.downloads("model.safetensors")
    assert len(gets) == 2
    assert gets[0].range is None
    assert gets[1].range is not None and gets[1].range.startswith("bytes=")
    assert gets[1].range == "bytes=30000000-"
    assert sha256_file(dest / "model.safetensors") == MINILM_SHA256


def test_pull_resumes_an_interrupted_earlier_run(hub_server: HubServer, tmp_path: Path,
                                                 minilm_snapshot: Path) -> None:
    lock = _pinned(hub_server, tmp_path, MINILM, include=["model.safetensors"])
    entry = Lockfile.load(lock).entry(MINILM)
    cache = tmp_path / "cache"
    # What a killed run leaves behind: a partial blob in the staging cache.
    staged = staging_part(cache / ".weights-staging", entry, entry.file("model.safetensors"))
    staged.parent.mkdir(parents=True)
    staged.write_bytes((minilm_snapshot / "model.safetensors").read_bytes()[:40_000_000])
    result = pull_entry(HubClient(hub_server.url), entry, cache=cache)
    gets = hub_server.hub.downloads("model.safetensors")
    assert [g.range for g in gets] == ["bytes=40000000-"]
    assert result.downloaded == ["model.safetensors"]
    assert verify_tree(cache, entry).ok
    assert not (cache / ".weights-staging").exists()


def test_corrupted_byte_same_size_is_caught_and_never_visible(hub_server: HubServer,
                                                              tmp_path: Path) -> None:
    lock = _pinned(hub_server, tmp_path, SHARDED)
    entry = Lockfile.load(lock).entry(SHARDED)
    shard = "model-00002-of-00002.safetensors"
    hub_server.hub.corrupt(shard, offset=5000)
    dest = tmp_path / "model"
    with pytest.raises(DigestMismatchError) as exc:
        pull_entry(HubClient(hub_server.url), entry, into=dest)
    assert exc.value.path == shard
    assert exc.value.expected == f"sha256:{entry.file(shard).sha256}"
    assert exc.value.actual.startswith("sha256:") and exc.value.actual != exc.value.expected
    assert not (dest / shard).exists()
    staging = tmp_path / ".model.weights-staging"
    assert not any(p.name.startswith(entry.file(shard).sha256) for p in staging.rglob("*"))
    # Same through the CLI: exit 1 naming file, expected and actual digest.
    hub_server.hub.corrupt(shard, offset=5000)
    r = run_cli(["pull", "--lock", str(lock), "--into", str(tmp_path / "cli")],
                endpoint=hub_server.url)
    assert r.returncode == 1
    assert shard in r.stderr and entry.file(shard).sha256 in r.stderr
    assert not (tmp_path / "cli" / shard).exists()
    # The fault was one-shot: a re-run completes.
    r = run_cli(["pull", "--lock", str(lock), "--into", str(tmp_path / "cli"), "-q"],
                endpoint=hub_server.url)
    assert r.returncode == 0, r.stderr
    assert verify_tree(tmp_path / "cli", entry).ok


def test_pull_refuses_to_write_through_a_symlinked_folder(hub_server: HubServer,
                                                          tmp_path: Path) -> None:
    from weights.errors import CacheLayoutError

    lock = _pinned(hub_server, tmp_path, SHARDED, include=["tokenizer/*"])
    entry = Lockfile.load(lock).entry(SHARDED)
    dest = tmp_path / "model"
    outside = tmp_path / "outside"
    outside.mkdir()
    dest.mkdir()
    (dest / "tokenizer").symlink_to(outside)
    with pytest.raises(CacheLayoutError, match="outside"):
        pull_entry(HubClient(hub_server.url), entry, into=dest)
    assert list(outside.iterdir()) == []


def test_cli_pull_several_models_and_gated_token(hub_server: HubServer, tmp_path: Path) -> None:
    from tests.hub_fixtures import GATED, HUB_TOKEN

    lock = tmp_path / "weights.lock"
    pin(HubClient(hub_server.url), lock, SHARDED, now=NOW, include=["*.json", "*.safetensors"])
    pin(HubClient(hub_server.url, token=HUB_TOKEN), lock, GATED, now=NOW)
    dest = tmp_path / "models"
    r = run_cli(["pull", "--lock", str(lock), "--into", str(dest), "-q"], endpoint=hub_server.url)
    assert r.returncode == 2 and "gated_repo" in r.stderr and "HF_TOKEN" in r.stderr
    assert not (dest / GATED / "model.safetensors").exists()
    r = run_cli(["pull", "--lock", str(lock), "--into", str(dest), "-q"], endpoint=hub_server.url,
                extra_env={"HF_TOKEN": HUB_TOKEN})
    assert r.returncode == 0, r.stderr
    locked = Lockfile.load(lock)
    for repo_id in (SHARDED, GATED):
        assert verify_tree(dest / repo_id, locked.entry(repo_id)).ok


def test_progress_counts_every_byte_once_including_resumed(hub_server: HubServer,
                                                           tmp_path: Path,
                                                           minilm_snapshot: Path) -> None:
    lock = _pinned(hub_server, tmp_path, MINILM, include=["model.safetensors", "*.json"])
    entry = Lockfile.load(lock).entry(MINILM)
    dest = tmp_path / "model"
    staged = staging_part(tmp_path / ".model.weights-staging", entry,
                          entry.file("model.safetensors"))
    staged.parent.mkdir(parents=True)
    staged.write_bytes((minilm_snapshot / "model.safetensors").read_bytes()[:1_000_000])
    hub_server.hub.cut_connection("model.safetensors", after_bytes=5_000_000)
    seen: list[int] = []
    pull_entry(HubClient(hub_server.url), entry, into=dest, progress=seen.append)
    assert sum(seen) == entry.total_bytes


def test_cli_progress_bar_on_a_terminal_shows_bytes_and_throughput(hub_server: HubServer,
                                                                   tmp_path: Path) -> None:
    import pty

    lock = _pinned(hub_server, tmp_path, SHARDED)
    primary, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=hub_server.url, HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(ROOT),
               COLUMNS="160", TERM="xterm")
    proc = subprocess.run(
        [sys.executable, "-m", "weights.cli", "pull", "--lock", str(lock), "--into",
         str(tmp_path / "m")], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=secondary, env=env, cwd=ROOT, timeout=120, check=False)
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(primary, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(primary)
    out = b"".join(chunks).decode("utf-8", "replace")
    assert proc.returncode == 0, out
    assert SHARDED in out and "/s" in out and "kB" in out  # bytes and throughput columns


def test_pull_into_a_cache_holding_the_repo_under_another_spelling_is_refused(
        hub_server: HubServer, tmp_path: Path) -> None:
    # The Hub treats repo ids case-insensitively; a cache that already holds the model as
    # SG-TEST/Tiny-Sharded (another pull, an airgap unpack) must not get a second copy next to
    # it, which a case-folding disk would merge into one folder.
    lock = _pinned(hub_server, tmp_path, SHARDED)
    entry = Lockfile.load(lock).entry(SHARDED)
    cache = tmp_path / "cache"
    twin = cache / "models--SG-TEST--Tiny-Sharded"
    (twin / "refs").mkdir(parents=True)
    n = len(hub_server.hub.requests)
    with pytest.raises(CacheLayoutError) as exc:
        pull_entry(HubClient(hub_server.url), entry, cache=cache)
    assert f"the cache holds {twin}" in str(exc.value)
    assert not hf_cache_paths(cache, SHARDED).repo_dir.exists()
    assert len(hub_server.hub.requests) == n  # refused before any download
