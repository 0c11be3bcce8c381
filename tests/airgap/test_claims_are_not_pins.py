"""A claimed upstream commit is never presented as a pin: after ``airgap unpack`` no HF cache
snapshot or ref is named by it, and ``inspect`` labels it as an unverified claim."""

from __future__ import annotations

from pathlib import Path

import pytest
from airgap_helpers import KeyPair, make_small_model, write_lock

from airgap import pack_bundle, unpack_bundle
from airgap.cli import main
from weights.local import content_id, local_entry

CLAIM = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
UPSTREAM = "sentence-transformers/all-MiniLM-L6-v2"


def test_unpacked_cache_names_the_content_not_the_claim(
    tmp_path: Path, keys: KeyPair, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_small_model(tmp_path / "src")
    entry = local_entry(src, repo_id=UPSTREAM, claimed_repo_id=UPSTREAM, claimed_commit=CLAIM)
    assert entry.commit == content_id(entry.files) != CLAIM
    lock = write_lock(tmp_path / "weights.lock", entry)
    bundle = tmp_path / "b"
    pack_bundle(lock, src, bundle, keys.private)
    store = tmp_path / "hub"
    report = unpack_bundle(bundle, [keys.public], store)
    snap = report.locations[UPSTREAM]
    assert snap.name == entry.commit
    names = {p.name for p in store.rglob("*")}
    assert CLAIM not in names
    refs = [p.read_text() for p in store.rglob("refs/*")]
    assert refs and all(CLAIM not in r for r in refs)

    assert main(["inspect", str(bundle)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # as read: wrapped between words at 80
    assert f"content id {entry.commit} (locked from local files, not a hub commit" in out
    assert f"upstream claimed {UPSTREAM}@{CLAIM}, not verified" in out
    assert f"commit {CLAIM}" not in out
