"""weights pin (and size/plan, which share the hub client) checks the hub's answer against
the request before anything is recorded or downloaded (tester's finding 07: a hub answering
`acme/harmless` with meta-llama's id and commit got that other model re-pinned with --update,
and a sibling `../../../tmp/pwned.json` ended as internal_error "this is a bug")."""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.hub_fixtures import MINILM, SHARDED, HubServer
from tests.weights.cli_util import run_cli
from weights import Lockfile
from weights.errors import HubAnswerError, HubMismatchError, UnsafeHubPathError
from weights.hub import HubClient
from weights.pin import pin

NOW = datetime(2026, 11, 30, 4, 0, 0, tzinfo=UTC)


def test_answer_for_another_repo_is_refused_and_the_lock_is_unchanged(
        hub_server: HubServer, tmp_path: Path) -> None:
    lock = tmp_path / "weights.lock"
    client = HubClient(hub_server.url)
    pin(client, lock, MINILM, now=NOW, include=["*.json"])
    before = lock.read_bytes()
    fetched = len(hub_server.hub.downloads(""))
    moved = "b" * 40

    def as_minilm(info: dict[str, Any]) -> dict[str, Any]:
        return {**info, "id": MINILM, "modelId": MINILM, "sha": moved}

    hub_server.hub.rewrite_info = as_minilm
    with pytest.raises(HubMismatchError) as exc:
        pin(client, lock, SHARDED, now=NOW, update=True)
    assert exc.value.code == "hub_mismatch"
    assert exc.value.message == (
        f"{SHARDED}@main: {hub_server.url} answered for repository '{MINILM}', not {SHARDED}; "
        "nothing was recorded")
    assert lock.read_bytes() == before
    assert len(hub_server.hub.downloads("")) == fetched  # nothing fetched for the answer
    r = run_cli(["pin", SHARDED, "--lock", str(lock), "--update"], endpoint=hub_server.url)
    assert r.returncode == 2 and "error [hub_mismatch]" in r.stderr, r.stderr
    assert lock.read_bytes() == before


def test_answer_with_another_commit_than_the_sha_asked_is_refused(
        hub_server: HubServer, tmp_path: Path) -> None:
    repo = hub_server.hub.find(SHARDED)
    assert repo is not None
    asked = repo.branches["main"]
    repo.commit({"x.txt": b"x"}, replace=False)  # main moves; the hub answers with the head

    def head(info: dict[str, Any]) -> dict[str, Any]:
        return {**info, "sha": repo.branches["main"]}

    hub_server.hub.rewrite_info = head
    with pytest.raises(HubMismatchError, match=f"answered with commit {repo.branches['main']}, "
                                               "not the commit asked for"):
        pin(HubClient(hub_server.url), tmp_path / "w.lock", SHARDED, asked)
    assert not (tmp_path / "w.lock").exists()
    hub_server.hub.rewrite_info = None
    e = pin(HubClient(hub_server.url), tmp_path / "w.lock", SHARDED, asked, now=NOW).entry
    assert e.commit == asked  # the honest answer still pins


@pytest.mark.parametrize(("path", "reason"), [
    ("../../../tmp/pwned.json", "has a '..' component"),
    ("/etc/cron.d/x", "is absolute"),
    ("sub/../../x.json", "has a '..' component"),
    ("a\\..\\b.json", "contains a backslash"),
    ("notes/\x1b[2Jx.md", "contains a control character"),
])
def test_unsafe_sibling_path_is_refused_with_its_own_code(
        hub_server: HubServer, tmp_path: Path, path: str, reason: str) -> None:
    repo = hub_server.hub.find(SHARDED)
    assert repo is not None
    repo.commit({path: b"{}"}, replace=False)
    with pytest.raises(UnsafeHubPathError) as exc:
        pin(HubClient(hub_server.url), tmp_path / "w.lock", SHARDED)
    assert exc.value.code == "unsafe_hub_path" and exc.value.path == path
    assert f"the hub lists a file {path!r} whose path {reason}" in exc.value.message
    assert hub_server.hub.downloads("") == []  # refused before any file was fetched
    assert not (tmp_path / "w.lock").exists()
    r = run_cli(["pin", SHARDED, "--lock", str(tmp_path / "w.lock")], endpoint=hub_server.url)
    assert r.returncode == 2 and "error [unsafe_hub_path]" in r.stderr, r.stderr
    assert "this is a bug" not in r.stderr


@pytest.mark.parametrize(("field", "message"), [
    ("blobId", "blob id '../"), ("size", "size -1 for 'config.json'")])
def test_malformed_sibling_values_are_refused_before_use(
        hub_server: HubServer, tmp_path: Path, field: str, message: str) -> None:
    """The blob id names the staging file a regular file is downloaded to: unchecked, a hub
    could have pin write anywhere (here: into tmp_path/escaped, from pin's temporary
    directory ``$TMPDIR/weights-pin-XXXX``)."""
    escape = "../" + os.path.relpath(tmp_path / "escaped", tempfile.gettempdir())
    value = escape if field == "blobId" else -1

    def bad(info: dict[str, Any]) -> dict[str, Any]:
        siblings = [{**s, field: value} if s["rfilename"] == "config.json" else s
                    for s in info["siblings"]]
        return {**info, "siblings": siblings}

    hub_server.hub.rewrite_info = bad
    with pytest.raises(HubAnswerError, match=message) as exc:
        pin(HubClient(hub_server.url), tmp_path / "w.lock", SHARDED, include=["config.json"])
    assert exc.value.code == "hub_answer_invalid"
    assert hub_server.hub.downloads("") == [] and not (tmp_path / "escaped").exists()
    assert Lockfile.load_or_empty(tmp_path / "w.lock").entries == ()
