"""An output file is complete or absent: ``clishell.atomic_file`` / ``write_atomic``.

Interrupted (``Interrupted`` is raised inside the block, as the CLI shell's signal handler does)
or failing half-way, nothing appears and no temporary file stays; an exclusive write never
replaces an existing file (a key); the mode is what ``open`` would give, or 0600 for a key.
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from clishell import Interrupted, atomic_file, write_atomic


def test_an_interrupted_write_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "export.jsonl"
    with pytest.raises(Interrupted), atomic_file(out) as fh:
        fh.write("first record\n")
        raise Interrupted(signal.SIGINT)
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_rewrite_keeps_the_old_file(tmp_path: Path) -> None:
    out = tmp_path / "proof.json"
    out.write_text("old\n")
    with pytest.raises(Interrupted), atomic_file(out) as fh:
        fh.write("new, half")
        raise Interrupted(signal.SIGTERM)
    assert out.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["proof.json"]


def test_a_finished_write_is_published_with_opens_mode(tmp_path: Path) -> None:
    out = tmp_path / "export.jsonl"
    old = os.umask(0o022)
    try:
        write_atomic(out, "a\nb\n")
    finally:
        os.umask(old)
    assert out.read_text() == "a\nb\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["export.jsonl"]


def test_an_exclusive_private_write_never_replaces_a_key(tmp_path: Path) -> None:
    key = tmp_path / "audit.key"
    write_atomic(key, "secret\n", exclusive=True, private=True)
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        write_atomic(key, "other\n", exclusive=True, private=True)
    assert key.read_text() == "secret\n"
    assert [p.name for p in tmp_path.iterdir()] == ["audit.key"]


def test_an_interrupted_audit_keygen_leaves_no_lone_private_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.audit import Signer, checkpoint, write_key_pair

    real = checkpoint.write_atomic

    def interrupted_on_the_public_key(path: Path, text: str, **kw: bool) -> None:
        if path.name.endswith(".pub"):
            raise Interrupted(signal.SIGINT)
        real(path, text, **kw)

    monkeypatch.setattr(checkpoint, "write_atomic", interrupted_on_the_public_key)
    with pytest.raises(Interrupted):
        write_key_pair(Signer.generate(), tmp_path / "audit.key")
    assert list(tmp_path.iterdir()) == []
