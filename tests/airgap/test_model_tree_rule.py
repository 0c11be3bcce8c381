"""One path rule for every command that reads a model tree: lock, verify, sign and pack refuse
the same hostile trees with the same code (a symlink to an outside directory or file, a name
with ':', a symlink loop), and none of them skips, follows or internal-errors on one."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from airgap_helpers import KeyPair, lock_entry_from_dir, write_lock
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from airgap import pack_bundle
from airgap.errors import VerificationFailed
from tests.hub_emulator import make_sharded
from tests.weights.cli_util import run_cli
from weights import Lockfile

REPO = "acme/tree"


def _model(root: Path) -> Path:
    root.mkdir(parents=True)
    for name, data in make_sharded([{"a": ("BF16", (8, 8))}]).items():
        (root / name).write_bytes(data)
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return root


def _outside_dir(model: Path) -> None:
    outside = model.parent / "secrets"
    outside.mkdir()
    (outside / "id_rsa").write_text("PRIVATE")
    (model / "tokenizer").symlink_to(outside)


def _outside_file(model: Path) -> None:
    outside = model.parent / "shadow"
    outside.write_text("root:x:0:0")
    (model / "vocab.txt").symlink_to(outside)


def _colon(model: Path) -> None:
    (model / "C:evil.txt").write_text("x")


def _loop(model: Path) -> None:
    os.symlink("b.txt", model / "a.txt")
    os.symlink("a.txt", model / "b.txt")


HOSTILE: dict[str, tuple[Callable[[Path], None], str]] = {
    "outside_dir": (_outside_dir, "symlink_outside"),
    "outside_file": (_outside_file, "symlink_outside"),
    "colon": (_colon, "unsafe_path"),
    "loop": (_loop, "symlink_loop"),
}


def _ec_key(tmp_path: Path) -> Path:
    key = tmp_path / "ec.pem"
    key.write_bytes(ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return key


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_lock_verify_and_sign_refuse_the_same_tree_with_the_same_code(
    tmp_path: Path, case: str
) -> None:
    plant, code = HOSTILE[case]
    model = _model(tmp_path / "m")
    lock = tmp_path / "weights.lock"
    r = run_cli(["lock", str(model), "--repo-id", REPO, "--lock", str(lock), "-q"])
    assert r.returncode == 0, r.stderr
    before = lock.read_bytes()
    plant(model)

    r = run_cli(["lock", str(model), "--repo-id", REPO, "--lock", str(lock), "-q", "--update"])
    assert (r.returncode, f"[{code}]") == (1, f"[{code}]") and f"[{code}]" in r.stderr, r.stderr
    assert "internal_error" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert lock.read_bytes() == before

    r = run_cli(["verify", str(model), "--lock", str(lock)])
    assert r.returncode == 1 and f"[{code}]" in r.stderr, r.stderr

    sig = tmp_path / "model.sig"
    r = run_cli(["sign", str(model), "--key", str(_ec_key(tmp_path)), "--out", str(sig), "-q"])
    assert r.returncode == 1 and f"[{code}]" in r.stderr, r.stderr
    assert not sig.exists()


@pytest.mark.parametrize("case", ["outside_file", "loop"])
def test_pack_refuses_a_pinned_file_that_became_a_hostile_link(
    tmp_path: Path, keys: KeyPair, case: str
) -> None:
    model = _model(tmp_path / "m")
    (model / "vocab.txt").write_text("root:x:0:0")
    lock = write_lock(tmp_path / "weights.lock", lock_entry_from_dir(model, REPO))
    (model / "vocab.txt").unlink()
    if case == "outside_file":
        _outside_file(model)  # same bytes, from outside the model
    else:
        os.symlink("vocab.txt", model / "vocab.txt.tmp")
        os.replace(model / "vocab.txt.tmp", model / "vocab.txt")  # links to itself
    out = tmp_path / "b"
    with pytest.raises(VerificationFailed) as exc:
        pack_bundle(lock, model, out, keys.private)
    want = "symlink_outside" if case == "outside_file" else "symlink_loop"
    assert exc.value.codes == {"unsafe_path"} and f"[{want}]" in exc.value.message
    assert not out.exists()


def test_links_inside_the_model_and_a_cache_snapshot_still_lock(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    (model / "sub").mkdir()
    (model / "sub" / "alias.json").symlink_to("../config.json")
    lock = tmp_path / "weights.lock"
    r = run_cli(["lock", str(model), "--repo-id", REPO, "--lock", str(lock), "-q"])
    assert r.returncode == 0, r.stderr
    assert "sub/alias.json" in {f.path for f in Lockfile.load(lock).entries[0].files}
