"""The hub emulator speaks what huggingface_hub expects (so the other tests mean something)."""

from __future__ import annotations

import httpx
import pytest

from tests.hub_emulator import Blob, is_lfs_path
from tests.hub_fixtures import GATED, HUB_TOKEN, MINILM, SHARDED, HubServer

MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def test_resolve_headers_regular_and_lfs(hub_server: HubServer) -> None:
    repo = hub_server.hub.find(MINILM)
    assert repo is not None
    commit = repo.branches["main"]
    with httpx.Client(base_url=hub_server.url) as c:
        r = c.head(f"/{MINILM}/resolve/main/config.json")
        assert r.status_code == 200
        assert r.headers["x-repo-commit"] == commit
        assert r.headers["content-length"] == "612"
        assert r.headers["etag"] == f'"{repo.commits[commit].files["config.json"].blob.git_sha1}"'
        assert "x-linked-etag" not in r.headers
        r = c.head(f"/{MINILM}/resolve/{commit}/model.safetensors")
        assert r.headers["x-linked-etag"] == f'"{MINILM_SHA256}"'
        assert r.headers["x-linked-size"] == "90868376"
        r = c.get(f"/{MINILM}/resolve/main/model.safetensors", headers={"Range": "bytes=0-7"})
        assert r.status_code == 206 and len(r.content) == 8
        assert r.headers["content-range"] == "bytes 0-7/90868376"
        r = c.get(f"/{MINILM}/resolve/main/config.json", headers={"Range": "bytes=9999-"})
        assert r.status_code == 416
        for url, code in ((f"/{MINILM}/resolve/main/absent.json", "EntryNotFound"),
                          (f"/{MINILM}/resolve/nobranch/config.json", "RevisionNotFound"),
                          ("/no/repo/resolve/main/config.json", "RepoNotFound")):
            r = c.get(url)
            assert (r.status_code, r.headers["x-error-code"]) == (404, code), url
        r = c.get(f"/{GATED}/resolve/main/config.json")
        assert (r.status_code, r.headers["x-error-code"]) == (401, "GatedRepo")
        r = c.get(f"/{GATED}/resolve/main/config.json",
                  headers={"Authorization": f"Bearer {HUB_TOKEN}"})
        assert r.status_code == 200


def test_tree_and_model_info_through_huggingface_hub(hub_server: HubServer) -> None:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub_server.url, token=False)
    tree = {e.path: e for e in api.list_repo_tree(SHARDED, recursive=True)}
    assert "tokenizer" in tree and "tokenizer/special_tokens_map.json" in tree
    shard = tree["model-00001-of-00002.safetensors"]
    assert shard.lfs is not None and shard.lfs.size == shard.size  # type: ignore[union-attr]
    top = {e.path for e in api.list_repo_tree(SHARDED)}
    assert "tokenizer/special_tokens_map.json" not in top and "tokenizer" in top
    info = api.model_info(MINILM, revision="v1.0", files_metadata=True)
    assert info.sha == hub_server.hub.find(MINILM).tags["v1.0"]  # type: ignore[union-attr]
    assert info.card_data is not None and info.card_data.license == "apache-2.0"
    st = next(s for s in info.siblings or [] if s.rfilename == "model.safetensors")
    assert st.lfs is not None and st.lfs.sha256 == MINILM_SHA256


def test_revision_with_slash_is_routed_by_raw_path(hub_server: HubServer) -> None:
    from huggingface_hub import HfApi

    repo = hub_server.hub.find(SHARDED)
    assert repo is not None
    sha = repo.commit({"pr.txt": b"pr\n"}, branch="refs/pr/1", replace=False)
    info = HfApi(endpoint=hub_server.url, token=False).model_info(SHARDED, revision="refs/pr/1")
    assert info.sha == sha


@pytest.mark.parametrize(("path", "size", "lfs"), [
    ("model.safetensors", 1, True), ("pytorch_model.bin", 1, True), ("model.onnx", 1, True),
    ("tokenizer.json", 10_000_001, True), ("tokenizer.json", 466_247, False),
])
def test_lfs_rule(path: str, size: int, lfs: bool) -> None:
    assert is_lfs_path(path, size) is lfs


def test_large_regular_named_file_is_served_as_lfs(hub_server: HubServer) -> None:
    repo = hub_server.hub.find(SHARDED)
    assert repo is not None
    big = Blob(b"\x01" * 10_000_001)
    repo.commit({"big.txt": big}, replace=False)
    with httpx.Client(base_url=hub_server.url) as c:
        r = c.head(f"/{SHARDED}/resolve/main/big.txt")
    assert r.headers["x-linked-etag"] == f'"{big.sha256}"'
