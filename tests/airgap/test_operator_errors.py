"""The airgap CLI as an operator meets it: exact names, space checked up front, one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from airgap_helpers import KeyPair, lock_entry_from_dir, tree_state, write_lock

from airgap import pack_bundle
from airgap.cli import main
from airgap.errors import AirgapError
from tests.conftest import file_size_limited

ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture
def odd_model(tmp_path: Path) -> Path:
    """File names that look like rich markup, and a long one."""
    root = tmp_path / "odd"
    (root / "a[").mkdir(parents=True)
    (root / "a[" / "b]").write_text("closing-tag lookalike\n")
    (root / "we[x]ird[bold].txt").write_text("markup lookalike\n")
    long = "tokenizer_" + "x" * 90 + ".json"
    (root / long).write_text("{}\n")
    (root / "config.json").write_text('{"model_type": "bert"}\n')
    return root


def test_inspect_shows_file_names_exactly_and_in_full(
    odd_model: Path, keys: KeyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = write_lock(tmp_path / "w.lock", lock_entry_from_dir(odd_model, "acme/odd"))
    bundle = tmp_path / "b"
    pack_bundle(lock, odd_model, bundle, keys.private)
    rc, out, err = run(capsys, "inspect", str(bundle))
    assert rc == 0, err
    for f in lock.entries[0].files:  # not eaten as markup, not truncated with an ellipsis
        assert f"acme/odd:{f.path}\t{f.size}\t{f.sha256}\t{f.blob_id}" in out.splitlines()
    assert "…" not in out


def test_pack_refuses_a_part_size_that_makes_absurdly_many_parts(
    small_model: Path, keys: KeyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = tmp_path / "w.lock"
    write_lock(lock, lock_entry_from_dir(small_model, "acme/tiny"))
    usb = tmp_path / "usb"
    usb.mkdir()
    before = tree_state(usb)
    rc, _, err = run(capsys, "pack", "--lock", str(lock), "--from", str(small_model), "--out",
                     str(usb / "b"), "--key", str(keys.private_path), "--part-size", "1")
    assert rc == 2
    assert "airgap: error [io_error]: --part-size 1 would split" in err and "at most 10000" in err
    assert tree_state(usb) == before


@pytest.mark.parametrize("command", ["pack", "oci-export"])
def test_an_output_in_a_missing_directory_is_refused_naming_it(
    command: str, small_model: Path, keys: KeyPair, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--out /media/usbb/x`` (a mistyped mount point) is refused, as cp or tar do, instead of
    quietly becoming a directory tree on another file system; nothing is created."""
    lock = tmp_path / "w.lock"
    locked = write_lock(lock, lock_entry_from_dir(small_model, "acme/tiny"))
    bundle = tmp_path / "bundle"
    pack_bundle(locked, small_model, bundle, keys.private)
    before = tree_state(tmp_path)
    out = tmp_path / "media" / "usbb" / "out"
    args = (["pack", "--lock", str(lock), "--from", str(small_model), "--key",
             str(keys.private_path)] if command == "pack"
            else ["oci-export", str(bundle), "-k", str(keys.public_path)])
    rc, _, err = run(capsys, *args, "--out", str(out))
    assert rc == 2
    assert err.strip() == (f"airgap: error [io_error]: --out {out}: directory {out.parent} does "
                           "not exist; create it first (nothing is created for you: check the "
                           "path)")
    assert tree_state(tmp_path) == before
    (tmp_path / "media").write_text("a file, not a directory\n")
    rc, _, err = run(capsys, *args, "--out", str(tmp_path / "media" / "out"))
    assert rc == 2
    assert err.strip() == (f"airgap: error [io_error]: --out {tmp_path / 'media' / 'out'}: "
                           f"{tmp_path / 'media'} is not a directory")


def test_pack_refuses_up_front_without_room_on_the_media(
    small_model: Path, keys: KeyPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = write_lock(tmp_path / "w.lock", lock_entry_from_dir(small_model, "acme/tiny"))
    usb = tmp_path / "usb"
    usb.mkdir()
    real = __import__("shutil").disk_usage
    monkeypatch.setattr("airgap.space.shutil.disk_usage",
                        lambda p: real(p)._replace(free=1000))
    with pytest.raises(AirgapError, match=r"needs \d+ bytes, 1000 free on the file system of"):
        pack_bundle(lock, small_model, usb / "b", keys.private)
    assert list(usb.iterdir()) == []


def test_unpack_refuses_up_front_without_room_in_the_store(
    pristine_bundle: Path, keys: KeyPair, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airgap import unpack_bundle

    store = tmp_path / "store"
    store.mkdir()
    real = __import__("shutil").disk_usage
    monkeypatch.setattr("airgap.space.shutil.disk_usage",
                        lambda p: real(p)._replace(free=1000))
    with pytest.raises(AirgapError, match=r"needs \d+ bytes, 1000 free on the file system of"):
        unpack_bundle(pristine_bundle, [keys.public], store)
    assert list(store.iterdir()) == []


def _cli_with_file_size_limit(args: list[str], limit: int) -> Any:
    """The airgap CLI whose file writes fail past ``limit`` bytes (EFBIG, as a full disk)."""

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(file_size_limited([sys.executable, "-m", "airgap.cli", *args], limit),
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def test_pack_write_failure_names_the_file_and_leaves_nothing(
    small_model: Path, keys: KeyPair, tmp_path: Path
) -> None:
    lock = tmp_path / "w.lock"
    write_lock(lock, lock_entry_from_dir(small_model, "acme/tiny"))
    usb = tmp_path / "usb"
    usb.mkdir()
    res = _cli_with_file_size_limit(["pack", "--lock", str(lock), "--from", str(small_model),
                                     "--out", str(usb / "b"), "--key", str(keys.private_path),
                                     "-q"], 50_000)  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "airgap: error [io_error]: cannot write" in res.stderr and "File too large" in res.stderr
    assert str(usb) in res.stderr  # says where
    assert list(usb.iterdir()) == []


def test_unpack_write_failure_names_the_file_and_leaves_store_unchanged(
    pristine_bundle: Path, keys: KeyPair, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    res = _cli_with_file_size_limit(["unpack", str(pristine_bundle), "--public-key",
                                     str(keys.public_path), "--into", str(store), "-q"],
                                    50_000)  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "airgap: error [io_error]: cannot write" in res.stderr and "File too large" in res.stderr
    assert str(store) in res.stderr
    assert list(store.iterdir()) == []


def test_hard_linked_copy_says_how_to_copy_instead(
    bundle: Path, keys: KeyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    linked = tmp_path / "linked"
    linked.mkdir()
    for f in bundle.iterdir():  # what `cp -al` or `rsync --link-dest` produce
        os.link(f, linked / f.name)
    rc, _, err = run(capsys, "verify", str(linked), "--public-key", str(keys.public_path))
    assert rc == 1
    assert "is a hard link (2 links); refusing it (copy the bundle as separate files" in err


def test_an_unexpected_exception_is_one_line_without_verbose(
    pristine_bundle: Path, keys: KeyPair, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defence in depth: a bug still prints one line (exit 2); --verbose adds the traceback."""

    def boom(*_: object, **__: object) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr("airgap.cli_verify.verify_bundle", boom)
    args = ("verify", str(pristine_bundle), "--public-key", str(keys.public_path))
    rc, _, err = run(capsys, *args)
    assert rc == 2
    assert err.startswith("airgap: error [internal_error]: unexpected RuntimeError: injected")
    assert "Traceback" not in err
    rc, _, err = run(capsys, *args, "--verbose")
    assert rc == 2 and "Traceback" in err


def test_unpack_of_another_revision_reports_the_moved_ref(
    small_model: Path, keys: KeyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second bundle of the same repo at another commit moves refs/main (as the Hub cache
    does) and keeps the old snapshot; the operator must be told, since `vllm serve REPO`
    without --revision serves the new commit after the next restart."""
    store = tmp_path / "store"
    old = write_lock(tmp_path / "old.lock", lock_entry_from_dir(small_model, "acme/tiny",
                                                                commit="a" * 40))
    new = write_lock(tmp_path / "new.lock", lock_entry_from_dir(small_model, "acme/tiny",
                                                                commit="b" * 40))
    for name, lock in (("old", old), ("new", new)):
        pack_bundle(lock, small_model, tmp_path / name, keys.private)
    assert run(capsys, "unpack", str(tmp_path / "old"), "-k", str(keys.public_path),
               "--into", str(store))[0] == 0
    rc, out, err = run(capsys, "unpack", str(tmp_path / "new"), "-k", str(keys.public_path),
                       "--into", str(store))
    assert rc == 0, err
    assert f"acme/tiny: refs/main moved {'a' * 12} -> {'b' * 12} (old snapshot kept)" in out
    snaps = store / "models--acme--tiny" / "snapshots"
    assert sorted(p.name for p in snaps.iterdir()) == ["a" * 40, "b" * 40]
    rc, out, _ = run(capsys, "unpack", str(tmp_path / "new"), "-k", str(keys.public_path),
                     "--into", str(store), "--json")
    assert rc == 0 and __import__("json").loads(out)["refs_moved"] == {}


def test_pack_refuses_a_part_size_beyond_64_bits(
    small_model: Path, keys: KeyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Other readers of the format parse part_size as an int64: never write a bigger one."""
    lock = tmp_path / "w.lock"
    write_lock(lock, lock_entry_from_dir(small_model, "acme/tiny"))
    rc, _, err = run(capsys, "pack", "--lock", str(lock), "--from", str(small_model), "--out",
                     str(tmp_path / "b"), "--key", str(keys.private_path), "--part-size",
                     str(2**63))  # fmt: skip
    assert rc == 2 and "--part-size" in err
    assert not (tmp_path / "b").exists()


def test_verify_rejects_an_index_integer_beyond_64_bits(
    bundle: Path, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    from airgap_helpers import load_index, resign

    doc = load_index(bundle)
    doc["part_size"] = 2**63
    resign(bundle, doc, keys.private)
    rc, _, err = run(capsys, "verify", str(bundle), "--public-key", str(keys.public_path))
    assert rc == 1
    assert "index_invalid" in err and "$.part_size" in err and "2^63 - 1" in err


def test_json_mode_reports_usage_and_io_errors_as_json_too(
    tmp_path: Path, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script reading `verify --json` gets a document for every outcome, not empty stdout."""
    import json

    rc, out, err = run(capsys, "verify", str(tmp_path / "absent"), "--public-key",
                       str(keys.public_path), "--json")  # fmt: skip
    assert rc == 2
    hint = ("give the directory that `airgap pack --out` wrote: it holds index.json, index.sig "
            "and the payload.* parts")
    message = f"{tmp_path / 'absent'} is not a bundle directory (does not exist)"
    assert json.loads(out) == {"ok": False, "error": {
        "code": "bundle_not_found", "message": message, "hint": hint}}
    # The line says what to do, not only what is wrong.
    assert err == f"airgap: error [bundle_not_found]: {message} (hint: {hint})\n"
