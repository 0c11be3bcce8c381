"""weights lock DIR: weights already on disk are locked without a network, with their origin,
a claimed upstream kept as a claim, the model card licence, and drift when the directory
changes; pack, verify, sign, size and unpack then work on them as on a pinned model."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from airgap import pack_bundle, unpack_bundle
from airgap.signing import generate_keypair, load_private_key, load_public_key
from tests.hub_fixtures import MINILM, HubServer
from tests.weights import pickle_samples as S
from tests.weights.cli_util import run_cli
from weights import Lockfile, verify_tree
from weights.errors import UnsafeSerialisationError
from weights.hub import HubClient
from weights.local import content_id, local_entry, lock_local, snapshot_claim
from weights.pin import pin

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
CLAIM = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"


@pytest.fixture
def minilm_copy(tmp_path: Path, minilm_snapshot: Path) -> Path:
    """A writable copy of the real snapshot (without the 90 MB weights, for drift tests)."""
    root = tmp_path / "minilm"
    shutil.copytree(minilm_snapshot, root, ignore=shutil.ignore_patterns("model.safetensors"))
    return root


def test_local_lock_of_real_minilm_equals_a_hub_pin_of_the_same_bytes(
    minilm_snapshot: Path, hub_server: HubServer, tmp_path: Path
) -> None:
    lock = tmp_path / "weights.lock"
    r = run_cli(["lock", str(minilm_snapshot), "--repo-id", MINILM, "--lock", str(lock),
                 "--claim-repo", MINILM, "--claim-commit", CLAIM, "-q"])  # unroutable endpoint
    assert r.returncode == 0, r.stderr
    local = Lockfile.load(lock).entry(MINILM)
    assert local.origin is not None and local.origin.kind == "local"
    assert local.origin.path == str(minilm_snapshot.absolute())
    assert (local.origin.claimed_repo_id, local.origin.claimed_commit) == (MINILM, CLAIM)
    # The claim stays a claim: the pin (and the snapshot unpack names) is the content id.
    assert local.commit == content_id(local.files) != CLAIM and local.license == "apache-2.0"
    hub_lock = tmp_path / "hub.lock"
    pin(HubClient(hub_server.url), hub_lock, MINILM, now=NOW)
    hub = Lockfile.load(hub_lock).entry(MINILM)
    assert [f.to_json() for f in local.files] == [f.to_json() for f in hub.files]
    assert json.loads(lock.read_text())["models"][0]["origin"] == {
        "kind": "local", "path": str(minilm_snapshot.absolute()),
        "claimed_repo_id": MINILM, "claimed_commit": CLAIM}


def test_without_a_claim_the_commit_is_a_content_id(minilm_copy: Path) -> None:
    a = local_entry(minilm_copy, repo_id="site/minilm", now=NOW)
    assert a.origin is not None and a.origin.claimed_commit is None
    assert a.commit == content_id(a.files) and len(a.commit) == 40
    (minilm_copy / "config.json").write_text("{}\n")
    assert local_entry(minilm_copy, repo_id="site/minilm", now=NOW).commit != a.commit


def test_drift_is_shown_and_refused_until_update(minilm_copy: Path, tmp_path: Path) -> None:
    lock = tmp_path / "weights.lock"
    assert run_cli(["lock", str(minilm_copy), "--repo-id", "site/minilm", "--lock", str(lock),
                    "-q"]).returncode == 0
    before = lock.read_bytes()
    again = run_cli(["lock", str(minilm_copy), "--repo-id", "site/minilm", "--lock", str(lock)])
    assert again.returncode == 0 and "unchanged" in again.stdout
    (minilm_copy / "config.json").write_text('{"changed": true}\n')
    (minilm_copy / "vocab.txt").unlink()
    (minilm_copy / "extra.json").write_text("{}\n")
    r = run_cli(["lock", str(minilm_copy), "--repo-id", "site/minilm", "--lock", str(lock)])
    assert r.returncode == 1
    assert "  + extra.json" in r.stderr and "  - vocab.txt" in r.stderr
    assert "  ~ config.json" in r.stderr and "--update" in r.stderr
    assert lock.read_bytes() == before
    v = run_cli(["verify", str(minilm_copy), "--lock", str(lock), "--json"])
    assert v.returncode == 1
    ok = run_cli(["lock", str(minilm_copy), "--repo-id", "site/minilm", "--lock", str(lock),
                  "--update", "-q"])
    assert ok.returncode == 0 and lock.read_bytes() != before
    assert run_cli(["verify", str(minilm_copy), "--lock", str(lock)]).returncode == 0


def test_pickle_in_a_local_directory_is_refused(minilm_copy: Path, tmp_path: Path) -> None:
    (minilm_copy / "pytorch_model.bin").write_bytes(S.torch_zip(S.torch_state_dict_pickle()))
    lock = tmp_path / "weights.lock"
    with pytest.raises(UnsafeSerialisationError, match="--allow-pickle"):
        lock_local(lock, minilm_copy, repo_id="site/minilm")
    assert not lock.exists()
    r = run_cli(["lock", str(minilm_copy), "--repo-id", "site/minilm", "--lock", str(lock),
                 "--allow-pickle", "-q"])
    assert r.returncode == 0, r.stderr
    scans = {f.path: f.scan for f in Lockfile.load(lock).entry("site/minilm").files}
    assert scans["pytorch_model.bin"] is not None and "safe" in scans["pytorch_model.bin"]


def test_a_name_is_needed_for_a_plain_directory(minilm_copy: Path, tmp_path: Path) -> None:
    r = run_cli(["lock", str(minilm_copy), "--lock", str(tmp_path / "l")])
    assert r.returncode == 2 and "--repo-id" in r.stderr


def _ec_key(d: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = d / "ec.pem", d / "ec.pub.pem"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


def test_locked_minilm_packs_unpacks_verifies_signs_sizes_and_relocks_from_the_cache(
    minilm_snapshot: Path, tmp_path: Path
) -> None:
    lock_path = tmp_path / "weights.lock"
    lock_local(lock_path, minilm_snapshot, repo_id=MINILM, now=NOW)
    lock = Lockfile.load(lock_path)
    entry = lock.entry(MINILM)
    # sign + verify with the signature and the lock; size from the local config/safetensors
    priv, pub = _ec_key(tmp_path)
    sig = tmp_path / "model.sig"
    assert run_cli(["sign", str(minilm_snapshot), "--key", str(priv), "--out", str(sig),
                    "-q"]).returncode == 0
    v = run_cli(["verify", str(minilm_snapshot), "--lock", str(lock_path), "--signature",
                 str(sig), "--public-key", str(pub)])
    assert v.returncode == 0, v.stderr
    size = run_cli(["size", str(minilm_snapshot), "--json"])
    assert size.returncode == 0, size.stderr
    params = [f["value"] for f in json.loads(size.stdout)["figures"]
              if f["name"] == "parameters"]
    assert params == [22_713_728]  # all-MiniLM-L6-v2: 22.7 M parameters
    # pack and unpack into an HF cache, as for a hub pin
    generate_keypair(tmp_path / "site.pem")
    bundle = tmp_path / "bundle"
    pack_bundle(lock, minilm_snapshot, bundle, load_private_key(tmp_path / "site.pem"))
    store = tmp_path / "cache"
    report = unpack_bundle(bundle, [load_public_key(tmp_path / "site.pub")], store)
    snap = report.locations[MINILM]
    assert snap.name == entry.commit and verify_tree(snap, entry).ok
    # a cache snapshot locks without a name: repository and commit come from the layout
    assert snapshot_claim(snap) == (MINILM, entry.commit)
    relocked = local_entry(snap, now=NOW)
    assert relocked.repo_id == MINILM and relocked.commit == entry.commit
    assert [f.to_json() for f in relocked.files] == [f.to_json() for f in entry.files]
    assert relocked.origin is not None and relocked.origin.claimed_commit == entry.commit


def test_lock_opens_no_socket_and_loads_no_hub_client(minilm_copy: Path, tmp_path: Path) -> None:
    from tests.weights.test_weights_egress import _guarded

    lock = tmp_path / "weights.lock"
    out = _guarded(["lock", str(minilm_copy), "--repo-id", "site/minilm", "--lock", str(lock),
                    "-q"])
    assert out == {"code": 0, "events": [], "loaded": []}
    assert Lockfile.load(lock).entry("site/minilm").origin is not None
