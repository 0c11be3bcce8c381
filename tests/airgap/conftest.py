"""Fixtures of the air-gap tests: signing keys, a small generated model, packed bundles."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from airgap import generate_keypair, load_private_key, load_public_key, pack_bundle
from tests.airgap.helpers import lock_entry_from_dir, write_lock
from weights import Lockfile

REPO = "acme/tiny-model"


@dataclass
class KeyPair:
    private_path: Path
    public_path: Path
    private: Ed25519PrivateKey
    public: Ed25519PublicKey


def _keypair(directory: Path, name: str) -> KeyPair:
    directory.mkdir(parents=True, exist_ok=True)
    priv = directory / f"{name}.pem"
    pub, _ = generate_keypair(priv)
    return KeyPair(priv, pub, load_private_key(priv), load_public_key(pub))


@pytest.fixture(scope="session")
def keys(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    return _keypair(tmp_path_factory.mktemp("keys"), "signer")


@pytest.fixture(scope="session")
def other_keys(tmp_path_factory: pytest.TempPathFactory) -> KeyPair:
    return _keypair(tmp_path_factory.mktemp("keys-other"), "intruder")


def make_small_model(root: Path) -> Path:
    """A small model: LFS weights spanning several parts, duplicates, an empty file, a subdir."""
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"model_type": "bert", "hidden_size": 8}\n')
    (root / "model.safetensors").write_bytes(os.urandom(300_000))
    (root / "tokenizer.json").write_text('{"version": "1.0"}\n' * 500)
    (root / "empty.txt").write_bytes(b"")
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}\n')
    (root / "copy_of_config.json").write_text('{"model_type": "bert", "hidden_size": 8}\n')
    (root / "vocäb.txt").write_text("[PAD]\n[UNK]\nhello\n")
    return root


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


BundleFactory = Callable[..., Path]
