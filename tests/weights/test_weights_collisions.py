"""Two pinned entries, one install path; Hub repo id rules; models without files.

A lockfile must install the same way on every file system and in both layouts (``dir`` and the
Hugging Face cache), so entries whose install paths are equal (ignoring case and Unicode
normalisation) or nest (a file that is also a directory) are refused wherever a lockfile is
read or built: lock load, pin, pull, verify (and pack/verify/unpack in tests/airgap).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.hub_emulator import Blob
from tests.hub_fixtures import HubServer
from tests.weights.cli_util import run_cli
from weights import Lockfile, LockfileError

COMMIT = "a" * 40


def _file(path: str, fill: str = "1") -> dict[str, Any]:
    return {"path": path, "size": 1, "sha256": fill * 64, "git_sha1": fill * 40, "lfs": False}


def _doc(*models: tuple[str, list[str]]) -> str:
    return json.dumps({"version": 1, "models": [
        {"repo_id": repo, "requested_revision": "main", "commit": COMMIT,
         "files": [_file(p) for p in paths]} for repo, paths in models]})


COLLIDING = {
    "case, one model": [("org/m", ["README.md", "readme.md"])],
    "NFC vs NFD, one model": [("org/m", ["\u00e9.txt", "e\u0301.txt"])],
    "file and directory, one model": [("org/m", ["x", "x/y"])],
    "repo ids equal ignoring case": [("Org/Model", ["a"]), ("org/model", ["b"])],
    "model dir under another model's file": [("a", ["b"]), ("a/b", ["c"])],
    "same path through two models": [("a", ["b/c"]), ("a/b", ["c"])],
}


@pytest.mark.parametrize("models", COLLIDING.values(), ids=COLLIDING.keys())
def test_lock_load_refuses_colliding_entries_naming_both(
    models: list[tuple[str, list[str]]],
) -> None:
    with pytest.raises(LockfileError) as info:
        Lockfile.loads(_doc(*models), source="w.lock")
    err = info.value
    assert err.code == "path_collision"  # a PathCollisionError
    assert err.message.startswith("w.lock: ")
    first, second = getattr(err, "first", None), getattr(err, "second", None)
    assert first and second and first != second
    assert first in err.message and second in err.message


def test_distinct_paths_still_load() -> None:
    lock = Lockfile.loads(_doc(("org/m", ["a/b", "a/c", "b"]), ("org/n", ["a/b"]),
                               ("org2/m", ["x"])))
    assert [e.repo_id for e in lock.entries] == ["org/m", "org/n", "org2/m"]


@pytest.mark.parametrize("path", ["a/./b", "a//b", "../b", "a/", "/b"])
def test_unnormalised_spellings_are_refused_before_they_can_collide(path: str) -> None:
    with pytest.raises(LockfileError, match="unsafe file path"):
        Lockfile.loads(_doc(("org/m", ["a/b", path])))


@pytest.mark.parametrize("repo_id", [
    "a--b/c", "a/b--c", "org/x..y", "-org/x", "org/x-", ".org/x", "org/x.", "org/m.git",
    "org/" + "x" * 97, "o" * 97 + "/x", "org/caf\u00e9", "a/b/c", "org/", "org/ x",
])
def test_repo_ids_follow_the_hub_rules(repo_id: str) -> None:
    with pytest.raises(LockfileError) as info:
        Lockfile.loads(_doc((repo_id, ["a"])), source="w.lock")
    assert "$.models[0].repo_id" in info.value.message


@pytest.mark.parametrize("repo_id", ["gpt2", "org/" + "x" * 96, "a_/_b", "o.r-g/m.o_d-3"])
def test_valid_repo_ids_load(repo_id: str) -> None:
    assert Lockfile.loads(_doc((repo_id, ["a"]))).entries[0].repo_id == repo_id


def test_model_without_files_is_refused_at_load() -> None:
    with pytest.raises(LockfileError, match=r"w\.lock: model org/empty pins no files") as info:
        Lockfile.loads(_doc(("org/m", ["a"]), ("org/empty", [])), source="w.lock")
    assert info.value.code == "empty_model"


@pytest.mark.parametrize("command", [
    ["verify", "{root}"], ["pull", "--into", "{root}"], ["verify", "{root}", "--json"],
])
@pytest.mark.parametrize("models", [
    [("a", ["b"]), ("a/b", ["c"])], [("org/m", ["a"]), ("org/empty", [])],
], ids=["collision", "empty"])
def test_every_command_refuses_such_a_lock(
    tmp_path: Path, command: list[str], models: list[tuple[str, list[str]]]
) -> None:
    lock = tmp_path / "weights.lock"
    lock.write_text(_doc(*models))
    root = tmp_path / "root"
    res = run_cli([c.format(root=root) for c in command] + ["--lock", str(lock)])
    assert res.returncode == 2, res.stderr
    code = "path_collision" if len(models[0][1]) == 1 and models[0][0] == "a" else "empty_model"
    assert f"weights: error [{code}]: {lock}: " in res.stderr
    if code == "path_collision":
        assert "a:b and a/b:c" in res.stderr
    if "--json" in command:
        assert json.loads(res.stdout)["error"]["code"] == code
    assert not root.exists()  # nothing was created


def test_pin_refuses_a_repo_whose_files_collide(hub_server: HubServer, tmp_path: Path) -> None:
    repo = hub_server.hub.add_repo("sg-test/two-readmes")
    repo.commit({"README.md": Blob(b"---\nlicense: mit\n---\n"), "readme.md": Blob(b"x\n"),
                 "config.json": Blob(b"{}\n")})
    lock = tmp_path / "weights.lock"
    res = run_cli(["pin", "sg-test/two-readmes", "--lock", str(lock)], endpoint=hub_server.url)
    assert res.returncode == 2, res.stderr
    assert "sg-test/two-readmes:README.md and sg-test/two-readmes:readme.md" in res.stderr
    assert not lock.exists()


def test_pin_refuses_a_second_model_colliding_with_the_first(hub_server: HubServer,
                                                              tmp_path: Path) -> None:
    # "sg-test" (a namespace-less repo) installs to ROOT/sg-test/<path> in the dir layout,
    # where the pinned sg-test/tiny-sharded already lives.
    hub_server.hub.add_repo("sg-test").commit({"tiny-sharded": Blob(b"x\n")})
    lock = tmp_path / "weights.lock"
    assert run_cli(["pin", "sg-test/tiny-sharded", "--lock", str(lock)],
                   endpoint=hub_server.url).returncode == 0
    before = lock.read_bytes()
    res = run_cli(["pin", "sg-test", "--lock", str(lock)], endpoint=hub_server.url)
    assert res.returncode == 2, res.stderr
    assert "weights: error [path_collision]" in res.stderr and "sg-test:tiny-sharded" in res.stderr
    assert lock.read_bytes() == before
