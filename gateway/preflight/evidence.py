"""The signed evidence pack: report + evidence files, sealed by an in-toto Statement in DSSE.

Layout of ``DIR`` (written to a temporary sibling and renamed: never half-written)::

    report.json  report.md                        the report (JSON, Markdown page)
    evidence/policy.json   evidence/config.json   config file digest, running config revision
    evidence/networkpolicies.json  evidence/nodes.json  evidence/status.json
    evidence/checkpoint.txt                       newest signed audit checkpoint (C2SP note)
    envelope.dsse.json                            DSSE envelope (the signature)
    signer.pub                                    the operator's public key (PEM, informative)

The envelope follows DSSE v1 (github.com/secure-systems-lab/dsse, ``envelope.md`` and
``protocol.md``): ``{"payloadType", "payload": base64, "signatures": [{"keyid", "sig"}]}``;
the signature is Ed25519 (RFC 8032) over
``PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`` (LEN: decimal byte
length). The payload is an in-toto Statement v1 (github.com/in-toto/attestation,
``spec/v1/statement.md``): ``_type`` ``https://in-toto.io/Statement/v1``, one ``subject`` per
file with its ``sha256``, ``predicateType`` :data:`PREDICATE_TYPE`, and the report summary as
predicate. :func:`verify_pack` checks the signature with a key the caller trusts, every
subject digest, and that no file was added. Nothing secret is written: credentials, key files
and environment values other than the checked switches never enter the facts.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from clishell import private_key_instead, read_input
from gateway.preflight.errors import EvidenceError
from gateway.preflight.inputs import Facts
from gateway.preflight.report import Report

__all__ = ["ENVELOPE", "PAYLOAD_TYPE", "PREDICATE_TYPE", "STATEMENT_TYPE", "PackReport", "pae",
           "verify_pack", "write_pack"]

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://sovereign-gateway.dev/preflight/v1"
ENVELOPE = "envelope.dsse.json"
_UNSIGNED = {ENVELOPE, "signer.pub"}


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding (the bytes the signature covers)."""
    t = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _load_private(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(read_input(path), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise EvidenceError(f"cannot load signing key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise EvidenceError(f"signing key {path} is not an Ed25519 key")
    return key


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    """Load the operator's Ed25519 private key (PEM, unencrypted) that signs packs.

    Raises:
        EvidenceError: Unreadable file or not an Ed25519 private key.
    """
    return _load_private(path)


def load_public(path: Path) -> Ed25519PublicKey:
    """Load an Ed25519 public key (PEM SubjectPublicKeyInfo).

    Raises:
        EvidenceError: Unreadable file or not an Ed25519 public key.
    """
    try:
        data = read_input(path)
    except OSError as exc:
        raise EvidenceError(f"cannot load public key {path}: {exc}") from exc
    mistake = private_key_instead(path, data)
    if mistake is not None:
        raise EvidenceError(mistake)
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise EvidenceError(f"cannot load public key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise EvidenceError(f"public key {path} is not an Ed25519 key")
    return key


def key_id(key: Ed25519PublicKey) -> str:
    """SHA-256 hex of the raw 32-byte public key (the envelope's ``keyid``)."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def evidence_files(report: Report, facts: Facts) -> dict[str, bytes]:
    """The files of a pack except the envelope: ``{relative path: content}``."""
    from gateway.preflight.checks_audit import latest_checkpoint

    files = {"report.json": _dump(report.to_json()), "report.md": report.to_markdown().encode()}
    if facts.policy is not None:
        files["evidence/policy.json"] = _dump({
            "revision": facts.policy.revision, "source": facts.policy.source,
            "document": facts.policy.document.model_dump(mode="json", by_alias=True)})
    status = facts.status or {}
    if facts.settings is not None or status:
        files["evidence/config.json"] = _dump({
            "file": str(facts.inputs.config) if facts.inputs.config else None,
            "file_sha256": facts.config_sha256,
            "running_config_revision": status.get("config_revision")})
    if facts.networkpolicies is not None:
        files["evidence/networkpolicies.json"] = _dump(facts.networkpolicies)
    if facts.nodes is not None:
        files["evidence/nodes.json"] = _dump(facts.nodes)
    if facts.status is not None:
        files["evidence/status.json"] = _dump(facts.status)
    if facts.status is not None or facts.settings is not None:
        cp = latest_checkpoint(facts)
        if cp is not None:
            files["evidence/checkpoint.txt"] = str(cp["note"]).encode()
    return files


def write_pack(out: Path, report: Report, facts: Facts, sign_key: Path,
               extra_files: dict[str, bytes] | None = None, *,
               evidence: dict[str, bytes] | None = None) -> Path:
    """Write and sign the evidence pack at ``out`` (must not exist, or be an empty directory).

    ``extra_files`` (``{relative path: bytes}``, e.g. the OSCAL documents) become subjects too.
    ``evidence`` is :func:`evidence_files` as computed already: pass the same bytes the extra
    files refer to by digest (reading ``facts`` again may read a newer audit checkpoint).

    Returns:
        The envelope path.

    Raises:
        EvidenceError: ``out`` is not empty, the key is not Ed25519, or a write failed.
    """
    key = _load_private(sign_key)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise EvidenceError(f"{out} exists and is not an empty directory")
    files = {**(evidence if evidence is not None else evidence_files(report, facts)),
             **(extra_files or {})}
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": n, "digest": {"sha256": hashlib.sha256(b).hexdigest()}}
                    for n, b in sorted(files.items())],
        "predicateType": PREDICATE_TYPE,
        "predicate": {"result": "fail" if report.exit_code else "pass",
                      "generated_at": report.generated_at, "counts": report.counts(),
                      "checks": {c.id: c.status for c in report.checks}},
    }
    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    pub = key.public_key()
    envelope = {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
                "signatures": [{"keyid": key_id(pub), "sig": base64.b64encode(
                    key.sign(pae(PAYLOAD_TYPE, payload))).decode()}]}
    files[ENVELOPE] = _dump(envelope)
    files["signer.pub"] = pub.public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for name, data in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(data)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except BaseException as exc:  # interrupted too: no half-written pack directory left
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise EvidenceError(f"cannot write evidence pack {out}: {exc}") from exc
        raise
    return out / ENVELOPE


@dataclass
class PackReport:
    """Outcome of :func:`verify_pack`.

    Attributes:
        directory: The pack.
        signature: ``verified`` or why not.
        problems: Tampered, missing or added files (empty when ok).
        subjects: ``{path: sha256}`` the statement lists.
        predicate: The statement's predicate (report summary), once the signature verified.
    """

    directory: str
    signature: str = "not checked"
    problems: list[str] = field(default_factory=list)
    subjects: dict[str, str] = field(default_factory=dict)
    predicate: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Signature verified and every file matches."""
        return self.signature == "verified" and not self.problems

    def to_json(self) -> dict[str, Any]:
        """As a JSON object (``ok`` included)."""
        return {"ok": self.ok, "directory": self.directory, "signature": self.signature,
                "problems": self.problems, "subjects": self.subjects,
                "predicate": self.predicate}


def _safe(root: Path, name: str) -> Path | None:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        return None
    return root.joinpath(*p.parts)


def verify_pack(directory: Path, public_key: Path) -> PackReport:
    """Verify a pack offline: DSSE signature by ``public_key``, then every file's digest.

    Returns:
        The report (``ok`` false when the signature or any file does not match).

    Raises:
        EvidenceError: No envelope, an unreadable or malformed envelope, or a bad key file.
    """
    key = load_public(public_key)
    out = PackReport(str(directory))
    try:
        env = json.loads((directory / ENVELOPE).read_text(encoding="utf-8"))
        ptype, payload = str(env["payloadType"]), base64.b64decode(env["payload"], validate=True)
        sigs = [base64.b64decode(s["sig"], validate=True) for s in env["signatures"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EvidenceError(f"{directory / ENVELOPE}: not a readable DSSE envelope: {exc}") \
            from exc
    if ptype != PAYLOAD_TYPE:
        out.signature = f"payloadType {ptype!r} is not {PAYLOAD_TYPE}"
        return out
    for sig in sigs:
        try:
            key.verify(sig, pae(ptype, payload))
            out.signature = "verified"
            break
        except InvalidSignature:
            out.signature = "no signature verifies with the given key"
    if out.signature != "verified":
        return out
    statement = json.loads(payload)
    if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != \
            PREDICATE_TYPE:
        out.problems.append("the statement is not a sovereign-gateway preflight statement")
        return out
    out.predicate = dict(statement.get("predicate") or {})
    for s in statement.get("subject") or ():
        name, want = str(s.get("name")), str((s.get("digest") or {}).get("sha256"))
        out.subjects[name] = want
        path = _safe(directory, name)
        if path is None:
            out.problems.append(f"{name}: unsafe subject name")
        elif not path.is_file():
            out.problems.append(f"{name}: missing")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != want:
            out.problems.append(f"{name}: content differs from the signed digest")
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if path.is_file() and rel not in out.subjects and rel not in _UNSIGNED:
            out.problems.append(f"{rel}: not covered by the signature")
    return out
