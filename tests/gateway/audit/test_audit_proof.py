"""Inclusion proofs: checked by an independent RFC 6962 implementation written here."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from _audit_helpers import write_log
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.audit import (
    AuditLog,
    NotSealedError,
    ProofError,
    RecordNotFound,
    Signer,
    open_store,
    prove,
    verify_proof,
)
from gateway.cli import main
from tests.gateway.gateway_cli import gateway


def _separate(*args: str) -> tuple[int, str, str]:
    """``gateway ARGS...`` in this process: exit status, standard output, standard error."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def independent_root(index: int, size: int, leaf: bytes, path: list[bytes]) -> bytes:
    """Rebuild the root from an RFC 6962 audit path, recursively (not the RFC 9162 loop)."""
    if size == 1:
        assert not path
        return leaf
    k = 1 << ((size - 1).bit_length() - 1)
    if index < k:
        return _h(b"\x01" + independent_root(index, k, leaf, path[:-1]) + path[-1])
    return _h(b"\x01" + path[-1] + independent_root(index - k, size - k, leaf, path[:-1]))


def independent_check(entry: dict[str, Any], public_key: bytes, key_name: str) -> dict[str, Any]:
    """Third-party check of one proof entry with nothing but the public key."""
    note = entry["checkpoint"]
    text, sigs = note.split("\n\n")
    dash, name, b64 = sigs.strip("\n").split(" ")
    assert dash == "\u2014" and name == key_name
    raw = base64.b64decode(b64)
    assert raw[:4] == _h(key_name.encode() + b"\n\x01" + public_key)[:4]
    Ed25519PublicKey.from_public_bytes(public_key).verify(raw[4:], (text + "\n").encode())
    origin, size, root_b64 = text.split("\n")
    record = entry["record"].encode()
    leaf = _h(b"\x00" + record)
    path = [base64.b64decode(p) for p in entry["proof"]]
    assert independent_root(entry["index"], int(size), leaf, path) == base64.b64decode(root_b64)
    obj: dict[str, Any] = json.loads(record)
    assert obj["chain"] == origin and obj["seq"] == entry["index"]
    return obj


def make_bundle(url: str, request_id: str) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        store = open_store(url, read_only=True)
        await store.open()
        try:
            return await prove(store, request_id)
        finally:
            await store.close()

    return asyncio.run(run())


def test_proof_verifies_independently(store_url: str, signer: Signer) -> None:
    write_log(store_url, signer, 37)
    for rid in ("req-0", "req-17", "req-36"):
        bundle = make_bundle(store_url, rid)
        [entry] = bundle["entries"]
        obj = independent_check(entry, signer.verifier.public_key, signer.name)
        assert obj["data"]["request_id"] == rid
        assert verify_proof(bundle, [signer.verifier]) == [obj]


def test_tampered_proofs_are_rejected(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    write_log(url, signer, 20)
    bundle = make_bundle(url, "req-9")
    entry = bundle["entries"][0]
    with pytest.raises(ProofError, match="not signed by a trusted key"):
        verify_proof(bundle, [Signer.generate(signer.name).verifier])
    forged = json.loads(json.dumps(bundle))
    forged["entries"][0]["record"] = entry["record"].replace("req-9", "req-8")
    forged["request_id"] = "req-8"
    with pytest.raises(ProofError, match="does not lead to the checkpoint root"):
        verify_proof(forged, [signer.verifier])
    moved = json.loads(json.dumps(bundle))
    moved["entries"][0]["proof"] = list(reversed(entry["proof"]))
    with pytest.raises(ProofError):
        verify_proof(moved, [signer.verifier])


def test_unsealed_and_unknown_records(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"

    async def run() -> None:
        log = AuditLog(open_store(url), signer, replica_id="r1", checkpoint_every_s=3600)
        await log.start()
        await log.append({"type": "request.started", "request_id": "fresh"})
        with pytest.raises(NotSealedError, match="not sealed"):
            await prove(log.store, "fresh")
        with pytest.raises(RecordNotFound):
            await prove(log.store, "never")
        await log.checkpoint()
        bundle = await prove(log.store, "fresh")
        assert verify_proof(bundle, [signer.verifier])[0]["data"]["request_id"] == "fresh"
        await log.close()

    asyncio.run(run())


def test_cli_prove_verify_export_tail(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    chain = write_log(url, signer, 12)
    pub = tmp_path / "audit.pub"
    pub.write_text(signer.verifier.vkey + "\n")
    out = tmp_path / "proof.json"
    res = gateway("audit", *["prove", "req-3", "--store", url, "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = gateway("audit", *["verify-proof", str(out), "--public-key", str(pub)])
    assert res.exit_code == 0 and f"OK {chain}#4 request.started" in res.output
    doc = json.loads(out.read_text())
    doc["entries"][0]["record"] = doc["entries"][0]["record"].replace('"v":1', '"v":2')
    out.write_text(json.dumps(doc))
    code, stdout, _ = _separate("audit", "verify-proof", str(out), "--public-key", str(pub),
                                "--json")
    assert code == 1 and json.loads(stdout)["ok"] is False

    res = gateway("audit", *["export", "--store", url, "--since", "2000-01-01T00:00:00"])
    lines = [json.loads(line) for line in res.output.splitlines()]
    assert res.exit_code == 0 and [x["seq"] for x in lines] == list(range(14))
    res = gateway("audit", *["export", "--store", url, "--until", "2000-01-01"])
    assert res.exit_code == 0 and res.output == ""
    res = gateway("audit", *["tail", "--store", url, "-n", "2"])
    assert res.exit_code == 0
    assert [line.split()[2] for line in res.output.splitlines()] == [
        "request.started",
        "chain.closed",
    ]
    assert "request_id=req-11" in res.output
    res = gateway("audit", *["prove", "nope", "--store", url])
    assert res.exit_code == 2 and "audit_not_found" in res.output


def test_cli_export_into_a_closed_pipe_ends_quietly(tmp_path: Path, signer: Signer) -> None:
    """`gateway audit export | head -1`: no error line, no traceback (click exits 1 on EPIPE)."""
    import subprocess
    import sys

    url = f"sqlite://{tmp_path / 'a.db'}"
    write_log(url, signer, 4000, checkpoint_every_records=1000)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "audit", "export", "--store", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # the reader goes away with most of the export unread
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 1
    assert json.loads(first)["seq"] == 0
    assert err == ""


def test_proof_failures_name_the_record_and_the_file(tmp_path: Path, signer: Signer) -> None:
    """``--json`` gives one JSON document (there were two: the command's own, whose ``error``
    was a bare string, then the shell's); a failed inclusion names the entry and its record;
    a file that is not JSON names the file (it said ``Expecting value: line 1 column 1``)."""
    url = f"sqlite://{tmp_path / 'a.db'}"
    chain = write_log(url, signer, 6)
    pub = tmp_path / "audit.pub"
    pub.write_text(signer.verifier.vkey + "\n")
    out = tmp_path / "proof.json"
    assert gateway("audit", "prove", "req-3", "--store", url, "--out", str(out)).exit_code == 0
    doc = json.loads(out.read_text())
    doc["entries"][0]["proof"][0] = base64.b64encode(b"\x00" * 32).decode()
    out.write_text(json.dumps(doc))

    code, stdout, stderr = _separate("audit", "verify-proof", str(out), "--public-key",
                                     str(pub), "--json")
    assert code == 1
    error = json.loads(stdout)["error"]  # the whole of stdout is one document
    assert error["code"] == "audit_proof_invalid"
    assert error["message"] == (f"proof entry 0 ({chain}#4 request.started): inclusion proof "
                                "does not lead to the checkpoint root")
    assert stderr.strip() == f"gateway: error [audit_proof_invalid]: {error['message']}"

    code, _, stderr = _separate("audit", "verify-proof", str(pub), "--public-key", str(pub))
    assert code == 2
    assert stderr.startswith(f"gateway: error [audit_format]: {pub} is not a proof bundle "
                             "(not JSON: "), stderr
    code, _, stderr = _separate("audit", "prove", "req-3", "--store", url, "--out",
                                str(tmp_path / "absent" / "proof.json"))
    assert code == 2  # was config_error naming write_atomic's temporary file
    assert stderr.strip().splitlines()[-1] == (
                              f"gateway: error [io_error]: cannot write the proof bundle to "
                              f"{tmp_path / 'absent' / 'proof.json'}: No such file or "
                              "directory"), stderr
    code, _, stderr = _separate("audit", "verify-proof", str(tmp_path / "absent.json"),
                                "--public-key", str(pub))
    assert code == 2
    assert stderr.strip() == (f"gateway: error [io_error]: cannot read proof bundle "
                              f"{tmp_path / 'absent.json'}: No such file or directory"), stderr


def test_export_and_tail_refuse_an_empty_window_and_negative_lines(
    tmp_path: Path, signer: Signer
) -> None:
    """``export --since`` after ``--until`` printed nothing and exited 0 (a report of no
    requests); ``tail -n -3`` printed nothing and exited 0."""
    url = f"sqlite://{tmp_path / 'a.db'}"
    write_log(url, signer, 4)
    code, out, err = _separate("audit", "export", "--store", url, "--since", "2026-12-02",
                               "--until", "2026-11-01")
    assert (code, out) == (2, "")
    assert err.strip() == ("gateway: error [usage_error]: --since 2026-12-02 is not before "
                           "--until 2026-11-01: the window holds no record (hint: --since is "
                           "inclusive, --until exclusive)"), err
    code, out, err = _separate("audit", "tail", "--store", url, "-n", "-3")
    assert (code, out) == (2, "") and "greater than or equal to 0" in err, err
