"""Fixtures of the air-gap tests: signing keys, a small generated model, packed bundles."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from airgap_helpers import REPO, KeyPair, keypair, lock_entry_from_dir, make_small_model, write_lock

from airgap import pack_bundle
from tests.hub_fixtures import hub, hub_server, minilm_blobs  # noqa: F401 - fixtures
from weights import Lockfile


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    return keypair(tmp_path_factory.mktemp("keys"), "signer")


@pytest.fixture(scope="session")
def other_keys(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    return keypair(tmp_path_factory.mktemp("keys-other"), "intruder")


@pytest.fixture(scope="session")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_small_model(tmp_path_factory.mktemp("src") / "tiny")


@pytest.fixture(scope="session")
def small_lock(small_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Lockfile:
    entry = lock_entry_from_dir(small_model, REPO)
    return write_lock(tmp_path_factory.mktemp("lock") / "weights.lock", entry)


PART_SIZE = 100_000


@pytest.fixture(scope="session")
def pristine_bundle(
    small_lock: Lockfile, small_model: Path, keys: KeyPair, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("bundles") / "tiny.bundle"
    pack_bundle(small_lock, small_model, out, keys.private, part_size=PART_SIZE)
    return out


@pytest.fixture
def bundle(pristine_bundle: Path, tmp_path: Path) -> Path:
    """A fresh copy of a good bundle that a test may damage."""
    dst = tmp_path / "bundle"
    shutil.copytree(pristine_bundle, dst)
    return dst


@pytest.fixture
def store(tmp_path: Path) -> Path:
    s = tmp_path / "store"
    s.mkdir()
    return s


