"""Canonical JSON, signed checkpoints (C2SP), key files and pseudonyms."""

from __future__ import annotations

import base64
import collections
import enum
import hashlib
import re
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.audit import (
    AuditConfigError,
    AuditFormatError,
    Checkpoint,
    ProofError,
    Signer,
    Verifier,
    canonical_json,
    generate_key_file,
    load_pseudonymizer,
    load_signer,
    load_verifier,
    open_checkpoint,
    write_key_pair,
)
from gateway.audit.checkpoint import sign_checkpoint
from gateway.audit.records import make_record, parse_body


def test_canonical_json_sorted_compact_utf8() -> None:
    out = canonical_json({"b": 1, "a": {"z": [True, None], "é": "ü€"}})
    assert out == '{"a":{"z":[true,null],"é":"ü€"},"b":1}'.encode()


@pytest.mark.parametrize("bad", [1.5, float("nan"), float("inf"), {1: "x"}, b"bytes", {"s": {1}}])
def test_canonical_json_rejects_non_integer_data(bad: object) -> None:
    with pytest.raises(AuditFormatError):
        canonical_json({"x": bad})


@pytest.mark.parametrize(("bad", "where"), [
    ({"a": [{"b": (1, 2.5)}]}, "$.x.a[0].b[1]: floats"),
    ([[[{"k": {3: 1}}]]], "$.x[0][0][0].k: object keys must be strings"),
    ({"a": [None, True, "s", {"b": bytearray(b"x")}]}, "$.x.a[3].b: unsupported type"),
])
def test_canonical_json_names_the_bad_value_deep_inside(bad: object, where: str) -> None:
    """The quick acceptance of plain values (``_plain``) leaves every refusal to the full
    check, which names where the bad value is."""
    with pytest.raises(AuditFormatError, match=re.escape(where)):
        canonical_json({"x": bad})


def test_canonical_json_accepts_what_the_full_check_accepts() -> None:
    """Values the quick test does not take (a dict subclass, an int subclass, more
    containers than its budget) still go through the full check."""

    class Level(enum.IntEnum):
        HIGH = 3

    wide = [[i] for i in range(20_000)]  # above the quick test's container budget
    assert canonical_json({"m": collections.OrderedDict(a=Level.HIGH)}) == b'{"m":{"a":3}}'
    assert canonical_json({"w": wide}).startswith(b'{"w":[[0],[1],')


def test_canonical_json_refuses_a_value_that_contains_itself() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises((RecursionError, ValueError)):
        canonical_json({"x": loop})


def test_record_hash_is_rfc6962_leaf_of_canonical_body() -> None:
    rec = make_record(
        chain="r/1",
        seq=3,
        prev=b"\x11" * 32,
        ts_us=5,
        type_="request.started",
        data={"request_id": "abc", "tokens": 7},
    )
    assert rec.hash == hashlib.sha256(b"\x00" + rec.body).digest()
    assert rec.request_id == "abc"
    obj = parse_body(rec.body)
    assert obj["prev"] == "11" * 32 and obj["seq"] == 3 and obj["v"] == 1
    assert canonical_json(obj) == rec.body


def test_signed_checkpoint_format_and_key_id() -> None:
    signer = Signer.generate("example.org/audit")
    cp = Checkpoint("r1/boot", 42, b"\x07" * 32)
    note = sign_checkpoint(cp, signer)
    body, sig_block = note.split("\n\n")
    root_b64 = base64.b64encode(b"\x07" * 32).decode()
    assert body + "\n" == f"r1/boot\n42\n{root_b64}\n"
    dash, name, b64 = sig_block.rstrip("\n").split(" ")
    assert dash == "\u2014" and name == "example.org/audit"
    raw = base64.b64decode(b64)
    pub = signer.verifier.public_key
    # Key hint per c2sp.org/signed-note: SHA-256(name || 0x0A || 0x01 || key)[:4].
    assert raw[:4] == hashlib.sha256(b"example.org/audit\n\x01" + pub).digest()[:4]
    Ed25519PublicKey.from_public_bytes(pub).verify(raw[4:], (body + "\n").encode())
    assert open_checkpoint(note, [signer.verifier]) == cp


def test_checkpoint_rejects_foreign_key_and_edited_body() -> None:
    signer, other = Signer.generate(), Signer.generate()
    note = sign_checkpoint(Checkpoint("r1/boot", 5, b"\x01" * 32), signer)
    with pytest.raises(ProofError, match="not signed by a trusted key"):
        open_checkpoint(note, [other.verifier])
    edited = note.replace("\n5\n", "\n6\n", 1)
    with pytest.raises(ProofError, match="invalid signature"):
        open_checkpoint(edited, [signer.verifier])
    with pytest.raises(AuditFormatError):
        open_checkpoint(note.replace("\u2014", "--"), [signer.verifier])


def test_key_files_roundtrip_and_permissions(tmp_path: Path) -> None:
    signer = Signer.generate()
    priv, pub = write_key_pair(signer, tmp_path / "audit.key")
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert load_signer(priv).verifier == signer.verifier
    assert load_verifier(pub) == signer.verifier
    assert Verifier.from_vkey(pub.read_text()).vkey == pub.read_text().strip()
    before = priv.read_bytes()
    with pytest.raises(AuditConfigError, match="refusing to overwrite"):
        write_key_pair(Signer.generate(), priv)
    assert priv.read_bytes() == before
    with pytest.raises(AuditConfigError):
        load_signer(pub)
    with pytest.raises(AuditConfigError):
        load_verifier(tmp_path / "missing.pub")


def test_pseudonyms_are_keyed_and_domain_separated(tmp_path: Path) -> None:
    k1 = load_pseudonymizer(generate_key_file(tmp_path / "p1"))
    k2 = load_pseudonymizer(generate_key_file(tmp_path / "p2"))
    assert stat.S_IMODE((tmp_path / "p1").stat().st_mode) == 0o600
    a = k1.pseudonymize("10.1.2.3")
    assert a == k1.pseudonymize("10.1.2.3") and a.startswith("hmac-sha256:")
    assert "10.1.2.3" not in a
    assert a != k2.pseudonymize("10.1.2.3")
    assert a != k1.pseudonymize("10.1.2.4")
    assert k1.content_digest(b"10.1.2.3") != a
    (tmp_path / "short").write_text(base64.b64encode(b"x" * 16).decode())
    with pytest.raises(AuditConfigError, match="at least 32 bytes"):
        load_pseudonymizer(tmp_path / "short")
    assert "key" not in repr(k1).replace("<key hidden>", "")


def test_pem_keys_are_accepted(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )

    key = Ed25519PrivateKey.generate()
    (tmp_path / "k.pem").write_bytes(
        key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    )
    (tmp_path / "k.pub.pem").write_bytes(
        key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    signer = load_signer(tmp_path / "k.pem")
    verifier = load_verifier(tmp_path / "k.pub.pem")
    note = sign_checkpoint(Checkpoint("r/1", 1, b"\x02" * 32), signer)
    assert open_checkpoint(note, [verifier]).size == 1
    with pytest.raises(ProofError):
        open_checkpoint(note, [Signer.generate().verifier])


def test_store_file_setting(tmp_path: Path) -> None:
    from gateway.audit import AuditSettings

    url_file = tmp_path / "url"
    url_file.write_text("postgresql://audit:secret@db:5432/audit\n")
    settings = AuditSettings(store_file=url_file)
    assert settings.store_url() == "postgresql://audit:secret@db:5432/audit"
    assert AuditSettings(store="sqlite:///x.db").store_url() == "sqlite:///x.db"
    url_file.write_text("mysql://nope")
    with pytest.raises(AuditConfigError, match="not a sqlite"):
        settings.store_url()
    with pytest.raises(AuditConfigError, match="cannot read"):
        AuditSettings(store_file=tmp_path / "missing").store_url()
