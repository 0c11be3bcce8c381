"""Hostile bundles and stores: each is rejected with its precise code and nothing changes.

Every test damages a copy of a good bundle the way an attacker or bad media would, then runs
``verify`` and ``unpack`` into a store that already holds another model, and asserts the error
code and that the store tree (types, sizes, digests, link targets) is byte-for-byte unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from airgap_helpers import (
    REPO,
    KeyPair,
    flip_byte,
    load_index,
    lock_entry_from_dir,
    make_small_model,
    resign,
    tree_state,
)

from airgap import Code, VerificationFailed, pack_bundle, unpack_bundle, verify_bundle
from airgap.cli import main as cli_main
from airgap.errors import AirgapError, StoreError
from weights import EmptyModelError, Lockfile

P0, P1, P2, P3 = (f"payload.00{i}-of-004" for i in range(4))


@pytest.fixture
def busy_store(tmp_path: Path, keys: KeyPair) -> Path:
    """A store that already holds another model (installed by a good bundle)."""
    store = tmp_path / "store"
    other = make_small_model(tmp_path / "other-src")
    lock = Lockfile(entries=(lock_entry_from_dir(other, "acme/other"),))
    pack_bundle(lock, other, tmp_path / "other.bundle", keys.private, part_size=1 << 20)
    unpack_bundle(tmp_path / "other.bundle", [keys.public], store)
    return store


def expect_rejected(bundle: Path, store: Path, keys: KeyPair, *codes: str) -> VerificationFailed:
    """verify reports ``codes`` (among others) and unpack raises without touching ``store``."""
    report = verify_bundle(bundle, [keys.public], workers=2)
    found = {p.code for p in report.problems}
    assert not report.ok
    assert set(codes) <= found, report.problems
    before = tree_state(store)
    with pytest.raises(VerificationFailed) as info:
        unpack_bundle(bundle, [keys.public], store, workers=2)
    assert set(codes) <= info.value.codes
    assert tree_state(store) == before
    assert not [p for p in store.iterdir() if p.name.startswith(".airgap-staging")]
    return info.value


# --- path traversal and names that collide -------------------------------------------------


def _rename_file(doc: dict[str, Any], old: str, new: str) -> None:
    for f in doc["lock"]["models"][0]["files"] + doc["files"]:
        if f["path"] == old:
            f["path"] = new


@pytest.mark.parametrize(
    "bad",
    [
        "../escape.json",
        "1_Pooling/../../escape.json",
        "/etc/evil.json",
        "sub\\..\\..\\evil.json",
        "C:/evil.json",
        "c:evil.json",
        "nul\x00byte.json",
        "./config2.json",
        "a//b.json",
        "tab\tname.json",
    ],
)
def test_unsafe_path_rejected(
    bundle: Path, busy_store: Path, keys: KeyPair, tmp_path: Path, bad: str
) -> None:
    doc = load_index(bundle)
    _rename_file(doc, "config.json", bad)
    resign(bundle, doc, keys.private)  # even a correctly signed index cannot escape
    exc = expect_rejected(bundle, busy_store, keys, Code.UNSAFE_PATH)
    assert exc.problems[0].path and "escape" not in str(list(tmp_path.glob("*")))
    assert not (tmp_path / "escape.json").exists()
    assert not (busy_store.parent / "escape.json").exists()


def test_unsafe_revision_name_rejected(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    doc = load_index(bundle)
    doc["lock"]["models"][0]["requested_revision"] = "../../../../outside"
    resign(bundle, doc, keys.private)
    expect_rejected(bundle, busy_store, keys, Code.UNSAFE_PATH)


def test_unsafe_part_name_rejected(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    doc = load_index(bundle)
    doc["parts"][0]["name"] = "../payload.000-of-004"
    resign(bundle, doc, keys.private)
    expect_rejected(bundle, busy_store, keys, Code.UNSAFE_PATH)


@pytest.mark.parametrize("twin", ["CONFIG.json", "Config.JSON", "config.json/inner"])
def test_case_colliding_names_rejected(
    bundle: Path, busy_store: Path, keys: KeyPair, twin: str
) -> None:
    doc = load_index(bundle)
    for section in (doc["lock"]["models"][0]["files"], doc["files"]):
        orig = next(f for f in section if f["path"] == "config.json")
        section.append(dict(orig, path=twin))
    resign(bundle, doc, keys.private)
    expect_rejected(bundle, busy_store, keys, Code.PATH_COLLISION)


# --- parts: links, devices, layout, damage -------------------------------------------------


def test_symlinked_part_rejected(
    bundle: Path, busy_store: Path, keys: KeyPair, tmp_path: Path
) -> None:
    # The link even points at the right bytes: a bundle must not make us follow links at all.
    shutil.move(bundle / P1, tmp_path / "elsewhere")
    (bundle / P1).symlink_to(tmp_path / "elsewhere")
    expect_rejected(bundle, busy_store, keys, Code.PART_SYMLINK)


def test_hardlinked_part_rejected(
    bundle: Path, busy_store: Path, keys: KeyPair, tmp_path: Path
) -> None:
    os.link(bundle / P2, tmp_path / "second-name")
    expect_rejected(bundle, busy_store, keys, Code.PART_HARDLINK)


def test_fifo_part_rejected_without_hanging(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    (bundle / P0).unlink()
    os.mkfifo(bundle / P0)
    expect_rejected(bundle, busy_store, keys, Code.PART_NOT_REGULAR)


@pytest.mark.skipif(os.geteuid() != 0, reason="creating a device node needs root")
def test_device_part_rejected(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    (bundle / P0).unlink()
    os.mknod(bundle / P0, 0o600 | 0o020000, os.makedev(1, 5))  # char device like /dev/zero
    expect_rejected(bundle, busy_store, keys, Code.PART_NOT_REGULAR)


def test_symlinked_index_rejected(
    bundle: Path, busy_store: Path, keys: KeyPair, tmp_path: Path
) -> None:
    shutil.move(bundle / "index.json", tmp_path / "index.json")
    (bundle / "index.json").symlink_to(tmp_path / "index.json")
    expect_rejected(bundle, busy_store, keys, Code.PART_SYMLINK)


def test_overlapping_parts_rejected(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    doc = load_index(bundle)
    doc["parts"][1]["offset"] -= 10
    resign(bundle, doc, keys.private)
    exc = expect_rejected(bundle, busy_store, keys, Code.PARTS_OVERLAP)
    assert exc.problems[-1].part == P1


def test_gap_between_parts_rejected(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    doc = load_index(bundle)
    doc["parts"][2]["offset"] += 10
    resign(bundle, doc, keys.private)
    exc = expect_rejected(bundle, busy_store, keys, Code.PARTS_GAP)
    assert exc.problems[-1].part == P2


def test_truncated_part_named(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    os.truncate(bundle / P1, 99_000)
    exc = expect_rejected(bundle, busy_store, keys, Code.PART_SIZE_MISMATCH)
    bad = next(p for p in exc.problems if p.code == Code.PART_SIZE_MISMATCH)
    assert (bad.part, bad.expected, bad.actual) == (P1, "100000", "99000")


def test_extended_part_named(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    with open(bundle / P3, "ab") as fh:
        fh.write(b"\0")
    exc = expect_rejected(bundle, busy_store, keys, Code.PART_SIZE_MISMATCH)
    assert next(p for p in exc.problems if p.code == Code.PART_SIZE_MISMATCH).part == P3


def test_flipped_byte_names_part_and_file(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    flip_byte(bundle / P2, 12_345)  # inside model.safetensors
    report = verify_bundle(bundle, [keys.public], workers=2)
    by_code = {p.code: p for p in report.problems}
    assert set(by_code) == {Code.CONTENT_DIGEST_MISMATCH, Code.PART_DIGEST_MISMATCH}
    assert by_code[Code.PART_DIGEST_MISMATCH].part == P2
    assert by_code[Code.CONTENT_DIGEST_MISMATCH].path == f"{REPO}:model.safetensors"
    expect_rejected(bundle, busy_store, keys, Code.CONTENT_DIGEST_MISMATCH)


def test_missing_part(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    (bundle / P2).unlink()
    exc = expect_rejected(bundle, busy_store, keys, Code.PART_MISSING)
    assert exc.problems[0].part == P2


def test_extra_part(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    shutil.copy(bundle / P3, bundle / "payload.004-of-005")
    exc = expect_rejected(bundle, busy_store, keys, Code.PART_EXTRA)
    assert exc.problems[0].part == "payload.004-of-005"


def test_every_problem_reported(bundle: Path, keys: KeyPair) -> None:
    flip_byte(bundle / P0, 50)  # inside config.json (bytes 35-76 of the payload)
    os.truncate(bundle / P2, 10)
    (bundle / P3).unlink()
    (bundle / "payload.999-of-999").write_bytes(b"x")
    report = verify_bundle(bundle, [keys.public], workers=2)
    parts = {(p.code, p.part) for p in report.problems}
    assert (Code.PART_DIGEST_MISMATCH, P0) in parts
    assert (Code.PART_SIZE_MISMATCH, P2) in parts
    assert (Code.PART_MISSING, P3) in parts
    assert (Code.PART_EXTRA, "payload.999-of-999") in parts
    assert Code.CONTENT_DIGEST_MISMATCH in {p.code for p in report.problems}
    assert Code.CONTENT_UNREADABLE in {p.code for p in report.problems}


# --- signature -----------------------------------------------------------------------------


def test_index_modified_after_signing(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    data = (bundle / "index.json").read_bytes()
    (bundle / "index.json").write_bytes(data.replace(b'"apache-2.0"', b'"mit"'))
    expect_rejected(bundle, busy_store, keys, Code.SIGNATURE_INVALID)


def test_signature_by_untrusted_key(
    bundle: Path, busy_store: Path, keys: KeyPair, other_keys: KeyPair
) -> None:
    resign(bundle, load_index(bundle), other_keys.private)
    expect_rejected(bundle, busy_store, keys, Code.SIGNATURE_UNTRUSTED_KEY)


def test_untrusted_signature_claiming_trusted_key_id(
    bundle: Path, busy_store: Path, keys: KeyPair, other_keys: KeyPair
) -> None:
    import json

    resign(bundle, load_index(bundle), other_keys.private)
    sig = json.loads((bundle / "index.sig").read_text())
    from airgap import key_id

    sig["key_id"] = key_id(keys.public)
    (bundle / "index.sig").write_text(json.dumps(sig))
    expect_rejected(bundle, busy_store, keys, Code.SIGNATURE_INVALID)


@pytest.mark.parametrize(
    ("damage", "code"),
    [
        (lambda b: (b / "index.sig").unlink(), Code.SIGNATURE_MISSING),
        (lambda b: (b / "index.sig").write_text("{not json"), Code.SIGNATURE_MALFORMED),
        (lambda b: (b / "index.json").unlink(), Code.INDEX_MISSING),
    ],
)
def test_signature_or_index_absent(
    bundle: Path, busy_store: Path, keys: KeyPair, damage: Callable[[Path], None], code: str
) -> None:
    damage(bundle)
    expect_rejected(bundle, busy_store, keys, code)


# --- content vs pins, empty models, format --------------------------------------------------


def test_content_not_matching_pins(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    doc = load_index(bundle)
    pin = next(f for f in doc["lock"]["models"][0]["files"] if f["path"] == "model.safetensors")
    pin["sha256"] = "0" * 64
    resign(bundle, doc, keys.private)
    exc = expect_rejected(bundle, busy_store, keys, Code.PIN_MISMATCH)
    assert exc.problems[0].expected == "0" * 64


def test_bundle_differs_from_operator_lockfile(
    bundle: Path, busy_store: Path, keys: KeyPair, small_model: Path
) -> None:
    expected = Lockfile(entries=(lock_entry_from_dir(small_model, REPO, commit="1" * 40),))
    report = verify_bundle(bundle, [keys.public], expected_lock=expected)
    assert [p.code for p in report.problems] == [Code.PIN_MISMATCH]
    before = tree_state(busy_store)
    with pytest.raises(VerificationFailed, match="expected lockfile"):
        unpack_bundle(bundle, [keys.public], busy_store, expected_lock=expected)
    assert tree_state(busy_store) == before


def test_empty_model_in_index(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    doc = load_index(bundle)
    doc["lock"]["models"][0]["files"] = []
    doc["files"] = []
    resign(bundle, doc, keys.private)
    expect_rejected(bundle, busy_store, keys, Code.EMPTY_MODEL)


def test_unknown_format_version(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    doc = load_index(bundle)
    doc["format_version"] = 2
    resign(bundle, doc, keys.private)
    expect_rejected(bundle, busy_store, keys, Code.UNSUPPORTED_FORMAT)


def test_duplicate_json_keys(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    from airgap.signing import sign_index

    data = (bundle / "index.json").read_bytes().replace(
        b'"compression": "none"', b'"compression": "none", "compression": "none"'
    )
    (bundle / "index.json").write_bytes(data)
    (bundle / "index.sig").write_bytes(sign_index(data, keys.private))
    expect_rejected(bundle, busy_store, keys, Code.INDEX_INVALID)


def test_unknown_file_field_rejected(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    # A format v1 file entry cannot smuggle a symlink or a mode.
    doc = load_index(bundle)
    doc["files"][0]["type"] = "symlink"
    resign(bundle, doc, keys.private)
    expect_rejected(bundle, busy_store, keys, Code.INDEX_INVALID)


def test_smuggled_blob_rejected(bundle: Path, busy_store: Path, keys: KeyPair) -> None:
    doc = load_index(bundle)
    doc["files"] = [f for f in doc["files"] if f["path"] != "tokenizer.json"]
    doc["lock"]["models"][0]["files"] = [
        f for f in doc["lock"]["models"][0]["files"] if f["path"] != "tokenizer.json"
    ]
    resign(bundle, doc, keys.private)
    expect_rejected(bundle, busy_store, keys, Code.BLOBS_LAYOUT)


# --- pack refuses bad sources ---------------------------------------------------------------


def test_pack_refuses_bytes_not_matching_pins(
    tmp_path: Path, small_lock: Lockfile, keys: KeyPair
) -> None:
    src = make_small_model(tmp_path / "src")
    lock = Lockfile(entries=(lock_entry_from_dir(src, REPO),))
    flip_byte(src / "model.safetensors", 1000)  # same size, different bytes
    out = tmp_path / "out.bundle"
    with pytest.raises(VerificationFailed) as info:
        pack_bundle(lock, src, out, keys.private, part_size=50_000)
    assert info.value.code == Code.PIN_MISMATCH
    assert info.value.problems[0].path == f"{REPO}:model.safetensors"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no bundle, no temp dir


def test_pack_refuses_size_mismatch_before_writing(tmp_path: Path, keys: KeyPair) -> None:
    src = make_small_model(tmp_path / "src")
    lock = Lockfile(entries=(lock_entry_from_dir(src, REPO),))
    (src / "config.json").write_text("{}")
    with pytest.raises(VerificationFailed) as info:
        pack_bundle(lock, src, tmp_path / "out", keys.private)
    assert info.value.code == Code.PIN_MISMATCH
    assert not (tmp_path / "out").exists()


def test_pack_refuses_empty_model(tmp_path: Path, keys: KeyPair) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(EmptyModelError):  # a lockfile with an empty model cannot even exist
        Lockfile(entries=(lock_entry_from_dir(tmp_path / "empty", REPO),))
    lock = tmp_path / "weights.lock"
    lock.write_text(json.dumps({"version": 1, "models": [lock_entry_from_dir(
        tmp_path / "empty", REPO).to_json()]}))
    rc = cli_main(["pack", "--lock", str(lock), "--from", str(tmp_path / "empty"), "--out",
                   str(tmp_path / "out"), "--key", str(keys.private_path)])
    assert rc == 2
    assert not (tmp_path / "out").exists()


def test_pack_refuses_missing_file(tmp_path: Path, keys: KeyPair) -> None:
    src = make_small_model(tmp_path / "src")
    lock = Lockfile(entries=(lock_entry_from_dir(src, REPO),))
    (src / "tokenizer.json").unlink()
    with pytest.raises(AirgapError) as info:
        pack_bundle(lock, src, tmp_path / "out", keys.private)
    assert info.value.code == Code.SOURCE_MISSING


# --- hostile or conflicting stores ----------------------------------------------------------


def test_store_symlink_not_followed(
    bundle: Path, store: Path, keys: KeyPair, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (store / "models--acme--tiny-model").symlink_to(outside)
    before = tree_state(store)
    with pytest.raises(StoreError) as info:
        unpack_bundle(bundle, [keys.public], store)
    assert info.value.code == Code.STORE_UNSAFE
    assert list(outside.iterdir()) == []
    assert tree_state(store) == before


def test_store_conflict_leaves_store_unchanged(
    bundle: Path, store: Path, keys: KeyPair
) -> None:
    unpack_bundle(bundle, [keys.public], store, layout="dir")
    target = store / REPO / "config.json"
    target.write_text('{"changed": true}')
    before = tree_state(store)
    with pytest.raises(StoreError) as info:
        unpack_bundle(bundle, [keys.public], store, layout="dir")
    assert info.value.code == Code.STORE_CONFLICT
    assert tree_state(store) == before


def test_failure_during_commit_is_rolled_back(
    bundle: Path, busy_store: Path, keys: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = tree_state(busy_store)
    real_symlink = os.symlink
    calls = {"n": 0}

    def flaky_symlink(src: str, dst: Any, *a: Any, **kw: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 4:  # blobs are placed by now, some links too
            raise OSError(28, "No space left on device")
        real_symlink(src, dst, *a, **kw)

    monkeypatch.setattr(os, "symlink", flaky_symlink)
    with pytest.raises(StoreError, match="rolled back") as info:
        unpack_bundle(bundle, [keys.public], busy_store)
    assert info.value.code == Code.IO_ERROR
    assert tree_state(busy_store) == before


# --- compressed blobs -----------------------------------------------------------------------


@pytest.fixture
def zbundle(small_lock: Lockfile, small_model: Path, keys: KeyPair, tmp_path: Path) -> Path:
    out = tmp_path / "zbundle"
    pack_bundle(small_lock, small_model, out, keys.private, compress=True, part_size=100_000)
    return out


def _zblob(bundle: Path) -> dict[str, Any]:
    return next(b for b in load_index(bundle)["blobs"] if b["encoding"] == "zlib")


def test_flipped_byte_in_compressed_blob(zbundle: Path, busy_store: Path, keys: KeyPair) -> None:
    blob = _zblob(zbundle)
    at = blob["offset"] + blob["stored_size"] // 2
    part = next(p for p in load_index(zbundle)["parts"]
                if p["offset"] <= at < p["offset"] + p["size"])  # fmt: skip
    flip_byte(zbundle / part["name"], at - part["offset"])
    expect_rejected(zbundle, busy_store, keys, Code.CONTENT_DIGEST_MISMATCH,
                    Code.PART_DIGEST_MISMATCH)  # fmt: skip


def test_decompression_bomb_rejected(
    zbundle: Path, busy_store: Path, keys: KeyPair
) -> None:
    """A signed index that understates a zlib blob's size: decoding stops at the declared size."""
    doc = load_index(zbundle)
    blob = next(b for b in doc["blobs"] if b["encoding"] == "zlib")
    for f in doc["files"] + doc["lock"]["models"][0]["files"]:
        if f["sha256"] == blob["sha256"]:
            f["size"] = 10
    blob["size"] = 10
    resign(zbundle, doc, keys.private)
    exc = expect_rejected(zbundle, busy_store, keys, Code.CONTENT_DIGEST_MISMATCH)
    assert "more than the declared 10 bytes" in exc.problems[0].message


def test_encoding_needs_declared_compression(
    zbundle: Path, busy_store: Path, keys: KeyPair
) -> None:
    doc = load_index(zbundle)
    doc["compression"] = "none"
    resign(zbundle, doc, keys.private)
    expect_rejected(zbundle, busy_store, keys, Code.UNSUPPORTED_FORMAT)


def test_unreadable_media_is_a_finding_not_a_crash(
    bundle: Path, busy_store: Path, keys: KeyPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error reading one part (a bad sector) is reported against that part."""
    bad = os.stat(bundle / P1).st_ino
    real_preadv = os.preadv

    def failing_preadv(fd: int, buffers: Any, offset: int) -> int:
        if os.fstat(fd).st_ino == bad:
            raise OSError(5, "Input/output error")
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", failing_preadv)
    exc = expect_rejected(bundle, busy_store, keys, Code.CONTENT_UNREADABLE)
    assert {p.part for p in exc.problems} == {P1}
    assert "Input/output error" in exc.problems[0].message


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 200_000 + b"]" * 200_000,
        b"\xff\xfe not utf-8",
        b'{"format": "sovereign-gateway/airgap-bundle", "format_version": 1}',
        b"null",
    ],
)
def test_garbage_index_is_rejected_cleanly(
    bundle: Path, busy_store: Path, keys: KeyPair, data: bytes
) -> None:
    from airgap.signing import sign_index

    (bundle / "index.json").write_bytes(data)
    (bundle / "index.sig").write_bytes(sign_index(data, keys.private))
    expect_rejected(bundle, busy_store, keys, Code.INDEX_INVALID)


def test_pack_refuses_extras_colliding_by_case(
    small_model: Path, small_lock: Lockfile, keys: KeyPair, tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "Policy.yaml").write_text("a: 1\n")
    (tmp_path / "b" / "policy.yaml").write_text("b: 2\n")
    with pytest.raises(VerificationFailed) as info:
        pack_bundle(small_lock, small_model, tmp_path / "out", keys.private,
                    include_files=[tmp_path / "a" / "Policy.yaml", tmp_path / "b" / "policy.yaml"])
    assert info.value.code == Code.PATH_COLLISION
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.*"))
