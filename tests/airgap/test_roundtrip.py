"""Round trips: pin -> pull -> pack -> verify -> unpack -> huggingface_hub loads it offline.

The offline load runs in a subprocess with ``HF_HUB_OFFLINE=1`` under an audit hook that blocks
and records any socket use, so it also proves that loading from the store needs no network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from airgap_helpers import KeyPair, lock_entry_from_dir, make_small_model, tree_state, write_lock

from airgap import pack_bundle, unpack_bundle, verify_bundle
from tests.hub_fixtures import MINILM, HubServer
from weights import Lockfile, hf_cache_paths, sha256_file

HERE = Path(__file__).parent
MINILM_SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

LOAD_OFFLINE = """
import hashlib, json, os, sys
from pathlib import Path
from huggingface_hub import hf_hub_download, snapshot_download
repo, commit, store, out = sys.argv[1:5]
single = hf_hub_download(repo, "config.json", revision=commit, cache_dir=store)
snap = snapshot_download(repo, revision="main", cache_dir=store, local_files_only=True)
digests = {p.relative_to(snap).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in sorted(Path(snap).rglob("*")) if p.is_file()}
Path(out).write_text(json.dumps({"single": single, "snapshot": snap, "digests": digests}))
"""


def offline_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1",
               PYTHONPATH=str(HERE), **extra)  # fmt: skip
    return env


def run_probe(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``offline_probe.py`` with ``args``; return its report (rc, socket events)."""
    report = tmp_path / f"probe-{len(list(tmp_path.glob('probe-*')))}.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "offline_probe.py"), str(report), *args],
        env=env or offline_env(), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert report.exists(), proc.stderr
    result: dict[str, Any] = json.loads(report.read_text())
    result["stderr"], result["stdout"] = proc.stderr, proc.stdout
    return result


def load_offline(tmp_path: Path, repo: str, commit: str, store: Path) -> dict[str, Any]:
    """Load ``repo`` from ``store`` with huggingface_hub, offline and with sockets blocked."""
    out = tmp_path / "loaded.json"
    script = f"import sys; sys.argv = ['x', {repo!r}, {commit!r}, {str(store)!r}, {str(out)!r}]\n"
    probe = run_probe(tmp_path, "-c", script + LOAD_OFFLINE)
    assert probe["rc"] == 0, probe["stderr"]
    assert probe["events"] == []
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def assert_matches_pins(loaded: dict[str, Any], lock: Lockfile, repo: str, store: Path) -> None:
    entry = lock.entry(repo)
    snapshot = hf_cache_paths(store, repo).snapshot(entry.commit)
    assert Path(loaded["snapshot"]) == snapshot
    assert loaded["single"] == str(snapshot / "config.json")
    assert loaded["digests"] == {f.path: f.sha256 for f in entry.files}


def test_minilm_round_trip_local_lock(
    minilm_snapshot: Path, keys: KeyPair, tmp_path: Path
) -> None:
    entry = lock_entry_from_dir(minilm_snapshot, MINILM)
    lock = write_lock(tmp_path / "weights.lock", entry)
    assert entry.file("model.safetensors").sha256 == MINILM_SAFETENSORS_SHA256
    bundle = tmp_path / "minilm.bundle"
    packed = pack_bundle(lock, minilm_snapshot, bundle, keys.private, part_size=16 * 1024**2)
    assert len(packed.index.parts) == 6
    report = verify_bundle(bundle, [keys.public], workers=2)
    assert report.ok, report.problems
    assert report.bytes_hashed == packed.index.payload_size
    store = tmp_path / "hf-cache"
    unpack_bundle(bundle, [keys.public], store, workers=2)
    assert_matches_pins(load_offline(tmp_path, MINILM, entry.commit, store), lock, MINILM, store)


def _cli(tool: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / tool
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True,
                          timeout=240, check=False)  # fmt: skip


def test_minilm_round_trip_through_hub_emulator(
    hub_server: HubServer, keys: KeyPair, tmp_path: Path
) -> None:
    """pin and pull with the weights CLI against the hub emulator, then carry it across."""
    online = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    online.update(HF_ENDPOINT=hub_server.url, HF_HUB_DISABLE_TELEMETRY="1")
    lock_path, cache = tmp_path / "weights.lock", tmp_path / "connected-cache"
    for args in (["pin", MINILM, "--lock", str(lock_path)],
                 ["pull", "--lock", str(lock_path), "--cache", str(cache), "--quiet"]):  # fmt: skip
        proc = _cli("weights", *args, env=online)
        assert proc.returncode == 0, proc.stderr + proc.stdout
    lock = Lockfile.load(lock_path)
    entry = lock.entry(MINILM)
    assert entry.file("model.safetensors").sha256 == MINILM_SAFETENSORS_SHA256

    # Connected side: pack from the HF cache the pull wrote, in several parts.
    bundle, store = tmp_path / "media" / "minilm.bundle", tmp_path / "airgapped-cache"
    bundle.parent.mkdir()  # the mounted medium
    airgap_env = offline_env()
    proc = _cli("airgap", "pack", "--lock", str(lock_path), "--from", str(cache), "--out",
                str(bundle), "--key", str(keys.private_path), "--part-size", "30000000",
                env=airgap_env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len([p for p in bundle.iterdir() if p.name.startswith("payload.")]) == 4

    # Air-gapped side: verify and unpack with nothing but the files and the public key.
    proc = _cli("airgap", "verify", str(bundle), "--public-key", str(keys.public_path),
                "--json", env=airgap_env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
    proc = _cli("airgap", "unpack", str(bundle), "--public-key", str(keys.public_path),
                "--into", str(store), env=airgap_env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    paths = hf_cache_paths(store, MINILM)
    assert paths.read_ref(entry.requested_revision) == entry.commit
    assert_matches_pins(load_offline(tmp_path, MINILM, entry.commit, store), lock, MINILM, store)


def test_verify_and_unpack_open_no_socket(
    pristine_bundle: Path, keys: KeyPair, tmp_path: Path
) -> None:
    """The CLI itself, in a subprocess whose every socket use is recorded and blocked."""
    pub = str(keys.public_path)
    store = tmp_path / "store"
    for argv in (["verify", str(pristine_bundle), "--public-key", pub, "--json"],
                 ["unpack", str(pristine_bundle), "--public-key", pub, "--into", str(store)],
                 ["inspect", str(pristine_bundle)]):  # fmt: skip
        probe = run_probe(tmp_path, "airgap.cli:main", *argv)
        assert probe["rc"] == 0, probe["stderr"]
        assert probe["events"] == [], argv
    assert (store / "models--acme--tiny-model" / "refs" / "main").is_file()
    # The probe does catch socket use (so the empty lists above mean something).
    probe = run_probe(tmp_path, "-c", "import socket; socket.getaddrinfo('localhost', 80)")
    assert probe["events"] and probe["events"][0][0] == "socket.getaddrinfo"


def test_rerun_skips_present_blobs_and_repairs_damaged_ones(
    pristine_bundle: Path, keys: KeyPair, store: Path, small_lock: Lockfile
) -> None:
    first = unpack_bundle(pristine_bundle, [keys.public], store)
    blobs = {f.blob_id for f in small_lock.entries[0].files}
    assert (first.written, first.skipped, first.repaired) == (len(blobs), 0, 0)
    state = tree_state(store)
    second = unpack_bundle(pristine_bundle, [keys.public], store)
    assert (second.written, second.skipped, second.bytes_written) == (0, len(blobs), 0)
    assert tree_state(store) == state
    pin = small_lock.entries[0].file("model.safetensors")
    blob = hf_cache_paths(store, small_lock.entries[0].repo_id).blob(pin.blob_id)
    data = bytearray(blob.read_bytes())
    data[7] ^= 0xFF
    blob.write_bytes(bytes(data))
    third = unpack_bundle(pristine_bundle, [keys.public], store)
    assert (third.repaired, third.written, third.bytes_written) == (1, 0, pin.size)
    assert sha256_file(blob) == pin.sha256
    assert tree_state(store) == state


def test_dir_layout_with_extras(
    small_model: Path, small_lock: Lockfile, keys: KeyPair, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("egress:\n  default: deny\n")
    chart = tmp_path / "sovereign-gateway-0.1.0.tgz"
    chart.write_bytes(os.urandom(5000))
    bundle = tmp_path / "b"
    pack_bundle(small_lock, small_model, bundle, keys.private, include_files=[policy, chart],
                part_size=64 * 1024)  # fmt: skip
    store, extras = tmp_path / "models", tmp_path / "deploy"
    report = unpack_bundle(bundle, [keys.public], store, layout="dir", extras_into=extras)
    root = store / small_lock.entries[0].repo_id
    assert report.locations == {small_lock.entries[0].repo_id: root}
    for f in small_lock.entries[0].files:
        assert sha256_file(root / f.path) == f.sha256
        assert not (root / f.path).is_symlink()
    assert (extras / "policy.yaml").read_bytes() == policy.read_bytes()
    assert (extras / chart.name).read_bytes() == chart.read_bytes()


def test_two_models_share_blobs_once_and_ref_moves(keys: KeyPair, tmp_path: Path) -> None:
    a = make_small_model(tmp_path / "a")
    b = make_small_model(tmp_path / "b")  # same config files, different weights
    lock = Lockfile(entries=(lock_entry_from_dir(a, "acme/a"), lock_entry_from_dir(b, "acme/b")))
    src = tmp_path / "src"
    (src / "acme").mkdir(parents=True)
    a.rename(src / "acme" / "a")
    b.rename(src / "acme" / "b")
    bundle = tmp_path / "ab"
    index = pack_bundle(lock, src, bundle, keys.private, part_size=1 << 20).index
    distinct = {f.sha256: f.size for e in lock.entries for f in e.files}
    (bom,) = index.extras  # the ML-BOM (airgap.mlbom) is the one extra, stored too
    assert index.payload_size == sum(distinct.values()) + bom.size
    assert index.payload_size < sum(e.total_bytes for e in lock.entries)
    store = tmp_path / "store"
    unpack_bundle(bundle, [keys.public], store)
    for e in lock.entries:
        snap = hf_cache_paths(store, e.repo_id).snapshot(e.commit)
        assert {f.path: sha256_file(snap / f.path) for f in e.files} == {
            f.path: f.sha256 for f in e.files
        }
    # A later pin of acme/a on main moves refs/main and keeps the old snapshot.
    (src / "acme" / "a" / "config.json").write_text('{"model_type": "bert", "v": 2}\n')
    newer = lock_entry_from_dir(src / "acme" / "a", "acme/a", commit="2" * 40)
    pack_bundle(Lockfile(entries=(newer,)), src / "acme" / "a", tmp_path / "a2", keys.private)
    unpack_bundle(tmp_path / "a2", [keys.public], store)
    paths = hf_cache_paths(store, "acme/a")
    assert paths.read_ref("main") == "2" * 40
    assert paths.snapshot(lock.entry("acme/a").commit).is_dir()


def test_all_parts_mode_hashes_every_part(pristine_bundle: Path, keys: KeyPair) -> None:
    quick = verify_bundle(pristine_bundle, [keys.public])
    full = verify_bundle(pristine_bundle, [keys.public], all_parts=True, workers=2)
    assert quick.ok and full.ok
    assert quick.index is not None
    assert full.bytes_hashed == 2 * quick.index.payload_size


def test_pack_replaces_only_with_force(
    small_model: Path, small_lock: Lockfile, keys: KeyPair, tmp_path: Path
) -> None:
    from airgap import AirgapError

    out = tmp_path / "b"
    pack_bundle(small_lock, small_model, out, keys.private, part_size=50_000)
    (out / "payload.099-of-099").write_bytes(b"stale")
    with pytest.raises(AirgapError) as info:
        pack_bundle(small_lock, small_model, out, keys.private)
    assert info.value.code == "output_exists"
    pack_bundle(small_lock, small_model, out, keys.private, force=True)
    names = sorted(p.name for p in out.iterdir())
    assert names == ["index.json", "index.sig", "payload.000-of-001"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no temp or old dirs left


def test_compression_is_off_by_default_and_optional(
    small_model: Path, small_lock: Lockfile, keys: KeyPair, tmp_path: Path
) -> None:
    plain = pack_bundle(small_lock, small_model, tmp_path / "plain", keys.private).index
    assert plain.compression == "none"
    assert all(b.encoding == "identity" for b in plain.blobs)
    packed = pack_bundle(small_lock, small_model, tmp_path / "z", keys.private, compress=True,
                         part_size=4096)  # fmt: skip
    index = packed.index
    encoding = {f.path: b.encoding for f in index.files for b in index.blobs
                if b.sha256 == f.sha256}  # fmt: skip
    assert encoding["tokenizer.json"] == "zlib"  # repetitive text shrinks
    assert encoding["model.safetensors"] == "identity"  # random "weights" do not
    assert index.payload_size < plain.payload_size
    report = verify_bundle(tmp_path / "z", [keys.public], workers=2)
    assert report.ok, report.problems
    store = tmp_path / "store"
    unpack_bundle(tmp_path / "z", [keys.public], store, layout="dir")
    for f in small_lock.entries[0].files:
        assert sha256_file(store / small_lock.entries[0].repo_id / f.path) == f.sha256


def test_recopying_the_named_part_repairs_the_bundle(
    bundle: Path, pristine_bundle: Path, keys: KeyPair
) -> None:
    import shutil

    from airgap_helpers import flip_byte

    flip_byte(bundle / "payload.001-of-004", 99_999)
    report = verify_bundle(bundle, [keys.public])
    damaged = {p.part for p in report.problems if p.code == "part_digest_mismatch"}
    assert damaged == {"payload.001-of-004"}
    for name in damaged:  # what the operator does: copy just that file again
        shutil.copyfile(pristine_bundle / name, bundle / name)
    assert verify_bundle(bundle, [keys.public]).ok
