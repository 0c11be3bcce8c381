"""The ``airgap`` CLI: commands, exit codes (0 ok / 1 verification failed / 2 usage or I/O)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from airgap_helpers import KeyPair, flip_byte, load_index, resign

from airgap.cli import main
from weights import Lockfile


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_keygen_writes_private_key_0600_and_public_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run(capsys, "keygen", "--out", str(tmp_path / "site.pem"))
    assert rc == 0
    assert stat.S_IMODE(os.stat(tmp_path / "site.pem").st_mode) == 0o600
    assert (tmp_path / "site.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert "key id" in out
    rc, _, err = run(capsys, "keygen", "--out", str(tmp_path / "site.pem"))
    assert rc == 2 and "output_exists" in err


def test_pack_verify_inspect_unpack(
    small_model: Path,
    small_lock: Lockfile,
    keys: KeyPair,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lock = tmp_path / "weights.lock"
    small_lock.save(lock)
    bundle = tmp_path / "usb" / "bundle"
    bundle.parent.mkdir()  # the mounted medium
    rc, out, err = run(capsys, "pack", "--lock", str(lock), "--from", str(small_model), "--out",
                       str(bundle), "--key", str(keys.private_path), "--part-size", "65536")
    assert rc == 0, err
    assert "into 5 parts" in out
    rc, out, err = run(capsys, "verify", str(bundle), "--public-key", str(keys.public_path))
    assert rc == 0, err
    assert out.startswith("OK")
    rc, out, _ = run(capsys, "inspect", str(bundle))
    assert rc == 0
    assert "acme/tiny-model" in out and "apache-2.0" in out and "payload.004-of-005" in out
    rc, out, _ = run(capsys, "inspect", str(bundle), "--json")
    assert json.loads(out)["lock"] == small_lock.to_json()
    store = tmp_path / "cache"
    rc, out, err = run(capsys, "unpack", str(bundle), "--public-key", str(keys.public_path),
                       "--into", str(store))
    assert rc == 0, err
    assert "acme/tiny-model ->" in out


def test_verify_damaged_bundle_json_exit_1(
    bundle: Path, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    flip_byte(bundle / "payload.001-of-004", 3)
    rc, out, _ = run(capsys, "verify", str(bundle), "--public-key", str(keys.public_path),
                     "--json")
    assert rc == 1
    doc = json.loads(out)
    assert doc["ok"] is False
    assert {p["code"] for p in doc["problems"]} == {
        "content_digest_mismatch", "part_digest_mismatch"}
    part = next(p for p in doc["problems"] if p["code"] == "part_digest_mismatch")
    assert part["part"] == "payload.001-of-004" and len(part["actual"]) == 64


def test_unpack_of_damaged_bundle_exit_1_store_untouched(
    bundle: Path, keys: KeyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.truncate(bundle / "payload.000-of-004", 5)
    store = tmp_path / "cache"
    rc, _, err = run(capsys, "unpack", str(bundle), "--public-key", str(keys.public_path),
                     "--into", str(store))
    assert rc == 1
    assert "part_size_mismatch" in err and "payload.000-of-004" in err
    assert not store.exists()


def test_untrusted_key_exit_1(
    bundle: Path, other_keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = run(capsys, "verify", str(bundle), "--public-key", str(other_keys.public_path))
    assert rc == 1 and "signature_untrusted_key" in err


def test_any_of_several_trusted_keys(
    bundle: Path, keys: KeyPair, other_keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = run(capsys, "verify", str(bundle), "-k", str(other_keys.public_path),
                     "-k", str(keys.public_path), "--quiet")
    assert rc == 0, err


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (["verify", "{tmp}/nope", "--public-key", "{pub}"], "bundle_not_found"),
        (["verify", "{bundle}", "--public-key", "{tmp}/missing.pem"], "key_invalid"),
        (["verify", "{bundle}", "--public-key", "{priv}"], "key_invalid"),
        (["unpack", "{bundle}", "--public-key", "{pub}", "--into", "{tmp}/s", "--layout", "zip"],
         "io_error"),
        (["pack", "--lock", "{tmp}/none.lock", "--from", "{tmp}", "--out", "{tmp}/o", "--key",
          "{priv}"], "lock_invalid"),
    ],
)
def test_usage_and_io_errors_exit_2(
    argv: list[str],
    code: str,
    bundle: Path,
    keys: KeyPair,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fmt = {"tmp": tmp_path, "pub": keys.public_path, "priv": keys.private_path, "bundle": bundle}
    rc, _, err = run(capsys, *[a.format(**fmt) for a in argv])
    assert rc == 2
    assert f"airgap: error [{code}]:" in err


def test_missing_required_option_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "verify")
    assert rc == 2 and "Missing" in err


def test_pack_one_repo_of_the_lock_and_unpack_json(
    keys: KeyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from airgap_helpers import lock_entry_from_dir, make_small_model

    src = tmp_path / "src"
    for name in ("a", "b"):
        make_small_model(src / "acme" / name)
    lock = tmp_path / "weights.lock"
    Lockfile(entries=tuple(lock_entry_from_dir(src / "acme" / n, f"acme/{n}") for n in "ab")).save(
        lock
    )
    bundle = tmp_path / "only-b"
    old = os.umask(0o022)
    try:
        rc, _, err = run(capsys, "pack", "--lock", str(lock), "--from", str(src), "--out",
                         str(bundle), "--key", str(keys.private_path), "--repo", "acme/b")
    finally:
        os.umask(old)
    assert rc == 0, err
    assert stat.S_IMODE(os.stat(bundle).st_mode) == 0o755  # readable by the media's other users
    rc, out, err = run(capsys, "unpack", str(bundle), "-k", str(keys.public_path), "--into",
                       str(tmp_path / "store"), "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert list(doc["locations"]) == ["acme/b"]
    assert doc["written"] == 6 and doc["skipped"] == 0
    rc, _, err = run(capsys, "pack", "--lock", str(lock), "--from", str(src), "--out",
                     str(tmp_path / "x"), "--key", str(keys.private_path), "--repo", "acme/c")
    assert rc == 2 and "lock_invalid" in err


@pytest.mark.parametrize(("field", "value"), [
    ("tool", "packer\x1b[2J\x1b[32m\nOK bundle: signed by your key"),
    ("license", "mit\x1b]0;owned\x07\nOK bundle"),
    ("created_at", "2026\u202e-11-30"),
])
@pytest.mark.parametrize("command", ["inspect", "verify", "unpack"])
def test_index_text_cannot_write_to_the_terminal(
    bundle: Path, keys: KeyPair, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    field: str, value: str, command: str,
) -> None:
    # inspect prints the index before any signature check, so the bundle's author (or anyone
    # who edits index.json) controls these strings; a signed one (a hostile packer, a licence
    # from a model card) reaches verify and unpack too. Refused, shown escaped, never raw.
    doc = load_index(bundle)
    if field == "license":
        doc["lock"]["models"][0]["license"] = value
    else:
        doc[field] = value
    resign(bundle, doc, keys.private)
    argv = {"inspect": ["inspect", str(bundle)],
            "verify": ["verify", str(bundle), "-k", str(keys.public_path), "-q"],
            "unpack": ["unpack", str(bundle), "-k", str(keys.public_path), "--into",
                       str(tmp_path / "store"), "-q"]}[command]
    rc, out, err = run(capsys, *argv)
    assert rc in (1, 2)
    assert "index_invalid" in out + err and "control or bidirectional-override" in out + err
    for char in ("\x1b", "\x07", "\u202e", "\nOK bundle"):
        assert char not in out + err
    assert not (tmp_path / "store").exists()
