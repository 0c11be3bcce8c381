"""Lockfile format: deterministic text, validation naming the JSON path, atomic save."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from weights import LockedFile, LockEntry, Lockfile, LockfileError, git_blob_sha1, sha256_file

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"

H64 = "ab" * 32
H40 = "cd" * 20


def _entry(repo: str = "org/model", commit: str = "1" * 40) -> LockEntry:
    return LockEntry(
        repo_id=repo,
        requested_revision="main",
        commit=commit,
        files=(
            LockedFile("model.safetensors", 10, H64, None, True),
            LockedFile("config.json", 2, "ef" * 32, H40, False),
            LockedFile("notes/modèle.md", 0, "00" * 32, "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391",
                       False),
        ),
        license="apache-2.0",
        gated=False,
        pinned_at="2026-11-30T04:00:00Z",
    )


def test_dumps_is_sorted_stable_and_matches_golden(tmp_path: Path) -> None:
    lock = Lockfile((_entry("zeta/z"), _entry("alpha/a", "2" * 40)))
    text = lock.dumps()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    doc = json.loads(text)
    assert [m["repo_id"] for m in doc["models"]] == ["alpha/a", "zeta/z"]
    assert [f["path"] for f in doc["models"][0]["files"]] == [
        "config.json", "model.safetensors", "notes/modèle.md"]
    assert "modèle" in text  # ensure_ascii=False: reviewers read real names
    golden = GOLDEN / "two-models.lock"
    if UPDATE:
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), "run with UPDATE_GOLDEN=1 to refresh"
    # Round trip is exact, and entry order in the constructor does not matter.
    lock.save(tmp_path / "w.lock")
    assert Lockfile.load(tmp_path / "w.lock") == lock
    assert Lockfile((_entry("alpha/a", "2" * 40), _entry("zeta/z"))).dumps() == text


def test_entry_lookup_and_blob_id() -> None:
    lock = Lockfile((_entry(),))
    e = lock.entry("org/model")
    assert lock.entry("ORG/Model") is e
    assert e.file("model.safetensors").blob_id == H64  # LFS: sha256
    assert e.file("config.json").blob_id == H40  # regular: git blob SHA-1
    with pytest.raises(KeyError):
        e.file("absent")
    with pytest.raises(Exception, match="not pinned") as exc:
        lock.entry("other/model")
    assert getattr(exc.value, "code", None) == "lock_entry_missing"


@pytest.mark.parametrize(
    ("mutate", "where"),
    [
        (lambda d: d["models"][0]["files"][1].update(sha256="xyz"), "$.models[0].files[1].sha256"),
        (lambda d: d["models"][0].update(commit="main"), "$.models[0].commit"),
        (lambda d: d["models"][0]["files"][0].update(path="../../etc/passwd"),
         "$.models[0].files[0].path"),
        (lambda d: d["models"][0]["files"][0].update(path="/abs"), "$.models[0].files[0].path"),
        (lambda d: d["models"][0]["files"][2].update(size=-1), "$.models[0].files[2].size"),
        (lambda d: d["models"][0]["files"][2].update(size=True), "$.models[0].files[2].size"),
        (lambda d: d["models"][0]["files"][0].update(lfs="yes"), "$.models[0].files[0].lfs"),
        (lambda d: d["models"][0]["files"].append(dict(d["models"][0]["files"][0])),
         "$.models[0].files[3].path"),
        (lambda d: d.update(version=2), "$.version"),
        (lambda d: d["models"][0].pop("files"), "$.models[0].files"),
        (lambda d: d["models"].append(dict(d["models"][0])), "$.models[1].repo_id"),
    ],
)
def test_invalid_field_is_named(tmp_path: Path, mutate, where: str) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(Lockfile((_entry(),)).dumps())
    mutate(doc)
    p = tmp_path / "weights.lock"
    p.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(LockfileError) as exc:
        Lockfile.load(p)
    assert str(p) in str(exc.value)
    assert where in str(exc.value)
    assert exc.value.code == "lockfile_invalid"


HOSTILE_TEXT = {
    "ansi-escape": "mit\x1b[2J\x1b[32mOK",
    "newline": "mit\nOK org/model: 3 files match",
    "carriage-return": "mit\rOK",
    "c1-csi": "mit\x9b2J",
    "bidi-override": "mit\u202eKO",
}


@pytest.mark.parametrize("text", HOSTILE_TEXT.values(), ids=HOSTILE_TEXT.keys())
@pytest.mark.parametrize("field", ["license", "origin_path", "requested_revision"])
def test_text_that_would_rewrite_terminal_output_is_refused(
    tmp_path: Path, text: str, field: str
) -> None:
    # A licence comes from the model card (the publisher's text) and every lock value is
    # printed by pin, verify and the air-gap commands: none may carry terminal control.
    doc = json.loads(Lockfile((_entry(),)).dumps())
    model = doc["models"][0]
    if field == "origin_path":
        model["origin"] = {"kind": "local", "path": text}
        where = "$.models[0].origin.path"
    else:
        model[field] = text
        where = f"$.models[0].{field}"
    p = tmp_path / "weights.lock"
    p.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(LockfileError) as exc:
        Lockfile.load(p)
    message = str(exc.value)
    assert where in message and "control or bidirectional-override characters" in message
    assert repr(text) in message and text not in message  # shown escaped, never raw


@pytest.mark.parametrize("text", HOSTILE_TEXT.values(), ids=HOSTILE_TEXT.keys())
def test_an_entry_built_from_hub_data_refuses_a_hostile_licence(text: str) -> None:
    # weights pin builds the entry from the Hub's model card: refused before it is saved.
    with pytest.raises(LockfileError, match="org/model: licence"):
        LockEntry(repo_id="org/model", requested_revision="main", commit="1" * 40,
                  files=(LockedFile("config.json", 2, "ef" * 32, H40, False),), license=text)


def test_not_json_and_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "weights.lock"
    p.write_text("{not json", encoding="utf-8")
    with pytest.raises(LockfileError, match=r"not valid JSON \(line 1"):
        Lockfile.load(p)
    with pytest.raises(LockfileError, match="not found"):
        Lockfile.load(tmp_path / "absent.lock")
    assert Lockfile.load_or_empty(tmp_path / "absent.lock") == Lockfile()


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    p = tmp_path / "weights.lock"
    p.write_text("old", encoding="utf-8")
    Lockfile((_entry(),)).save(p)
    assert Lockfile.load(p).entries[0].repo_id == "org/model"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["weights.lock"]
    # A failing write (target is a directory) leaves the directory and no temp file behind.
    d = tmp_path / "dir.lock"
    d.mkdir()
    with pytest.raises(LockfileError, match="cannot write"):
        Lockfile((_entry(),)).save(d)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["dir.lock", "weights.lock"]


def test_digests_match_git_and_the_published_sha256(minilm_snapshot: Path, tmp_path: Path) -> None:
    import subprocess

    cfg = minilm_snapshot / "config.json"
    want = subprocess.run(["git", "hash-object", str(cfg)], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert git_blob_sha1(cfg) == want
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert git_blob_sha1(empty) == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert sha256_file(minilm_snapshot / "model.safetensors") == (
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db")
