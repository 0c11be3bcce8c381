"""Chains nobody trusted signed: whole forged chains, long unsealed tails, hostile chain ids.

Someone who can write to the audit database but holds no trusted signing key can insert whole
chains with valid hash links (the gateway's own ``AuditLog`` with a key of their own, its
checkpoints then deleted). A writer signs a checkpoint over ``chain.started`` as it starts, so
such a chain is ``unauthenticated_chain`` (exit 1) unless ``--allow-unsealed CHAIN`` names it;
a crashed writer's short, recent unsealed tail stays a warning.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from _audit_helpers import codes_at, raw_sql, verify, write_log

from gateway.audit import AuditLog, Signer, open_store
from gateway.audit.records import make_record
from tests.gateway.gateway_cli import gateway


def _crashed_writer(url: str, signer: Signer, replica: str, n: int, *,
                    checkpoint_every_records: int = 1000, checkpoint_every_s: float = 10.0,
                    heartbeat_s: float = 60.0) -> str:
    """A writer that appends ``n`` records and dies without closing (its tail unsealed)."""

    async def run() -> str:
        log = AuditLog(open_store(url), signer, replica_id=replica,
                       checkpoint_every_records=checkpoint_every_records,
                       checkpoint_every_s=checkpoint_every_s, heartbeat_s=heartbeat_s)
        await log.start()
        for i in range(n):
            await log.append({"type": "request.started", "request_id": f"{replica}-{i}",
                              "key_id": "alice", "destination": "provider-us"})
        await log.store.close()  # as if the process was killed
        return log.chain_id

    return asyncio.run(run())


def _pub(tmp_path: Path, signer: Signer) -> str:
    pub = tmp_path / "audit.key.pub"
    pub.write_text(signer.verifier.vkey + "\n")
    return str(pub)


def test_forged_chains_without_a_trusted_checkpoint_fail(
    store_url: str, signer: Signer, tmp_path: Path
) -> None:
    real = write_log(store_url, signer, 6, replica="gw-0")
    attacker = Signer.generate()
    forged = [_crashed_writer(store_url, attacker, r, 3, checkpoint_every_records=1000)
              for r in ("gw-9", "gw-0")]
    for chain in forged:  # the attacker's own signatures would be bad_signature: drop them
        raw_sql(store_url, "DELETE FROM audit_checkpoints WHERE chain = ?", chain)
    pub = _pub(tmp_path, signer)
    out = gateway("audit", "verify", "--store", store_url, "--public-key", pub)
    assert out.exit_code == 1, out.output
    assert "OK" not in out.output.splitlines()[-1]
    for chain in forged:
        assert f"ERROR unauthenticated_chain [{chain} seq 0]: none of its 4 records is covered " \
               "by a checkpoint signed by a trusted key" in out.output
    assert f"{real}: 8 records, sealed 8" in out.output  # the real chain still verifies
    assert f"[{real}" not in out.output
    doc = json.loads(gateway("audit", "verify", "--store", store_url, "--public-key", pub,
                             "--json").output)
    assert {f["chain"] for f in doc["findings"] if f["code"] == "unauthenticated_chain"} == \
        set(forged)
    # Naming one of them accepts that one only; naming both passes, and the OK line says so.
    one = gateway("audit", "verify", "--store", store_url, "--public-key", pub,
                  "--allow-unsealed", forged[0])
    assert one.exit_code == 1 and f"unauthenticated_chain [{forged[1]} seq 0]" in one.output
    both = gateway("audit", "verify", "--store", store_url, "--public-key", pub,
                   "--allow-unsealed", forged[0], "--allow-unsealed", forged[1])
    assert both.exit_code == 0, both.output
    assert both.output.splitlines()[-1] == (
        "OK: no tampering found; 2 chain(s) accepted unauthenticated (--allow-unsealed): "
        f"{forged[0]}, {forged[1]}")


def test_chain_with_every_checkpoint_deleted_fails_without_keys(
    tmp_path: Path, signer: Signer
) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    chain = _crashed_writer(url, signer, "gw-0", 3)
    raw_sql(url, "DELETE FROM audit_checkpoints WHERE chain = ?", chain)
    report = verify(url, None)
    assert ("unauthenticated_chain", chain, 0) in codes_at(report)


def test_crashed_writers_short_recent_tail_is_a_warning(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    chain = _crashed_writer(url, signer, "gw-0", 5, checkpoint_every_records=10)
    out = gateway("audit", "verify", "--store", url, "--public-key", _pub(tmp_path, signer))
    assert out.exit_code == 0, out.output
    assert f"WARNING unsealed [{chain} seq 1]: records 1..5 are not covered" in out.output
    assert out.output.splitlines()[-1] == "OK: no tampering found"


def _append_forged(url: str, chain: str, n: int, ts_us: int | None = None) -> None:
    """Append ``n`` records with valid links at the end of ``chain`` (no key needed)."""
    last = raw_sql(url, "SELECT seq, hash, ts_us FROM audit_records WHERE chain = ? "
                   "ORDER BY seq DESC LIMIT 1", chain)[0]
    seq, prev, ts = int(last[0]) + 1, bytes(last[1]), int(last[2])
    for i in range(n):
        rec = make_record(chain=chain, seq=seq, prev=prev, ts_us=ts_us or ts + i,
                          type_="request.started", data={"request_id": f"forged-{i}"})
        raw_sql(url, "INSERT INTO audit_records (chain, seq, ts_us, type, request_id, hash, "
                "body) VALUES (?, ?, ?, ?, ?, ?, ?)", chain, seq, rec.ts_us, rec.type,
                f"forged-{i}", rec.hash, rec.body)
        seq, prev = seq + 1, rec.hash


def test_tail_longer_or_later_than_its_writer_allows_fails(
    tmp_path: Path, signer: Signer
) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    chain = _crashed_writer(url, signer, "gw-0", 3, checkpoint_every_records=10,
                            checkpoint_every_s=5.0, heartbeat_s=10.0)
    _append_forged(url, chain, 8)  # 11 unsealed: the writer seals every 10
    report = verify(url, signer)
    assert ("unsealed_overdue", chain, 1) in codes_at(report)
    assert "11 records, but the writer signs a checkpoint every 10 records" in str(report.errors)
    assert verify(url, signer, allow_unsealed={chain}).ok

    late = f"sqlite://{tmp_path / 'b.db'}"
    chain = _crashed_writer(late, signer, "gw-0", 1, checkpoint_every_s=5.0, heartbeat_s=10.0)
    sealed_ts = int(raw_sql(late, "SELECT ts_us FROM audit_records WHERE chain = ? AND seq = 0",
                            chain)[0][0])
    _append_forged(late, chain, 1, ts_us=sealed_ts + 3_600_000_000)  # an hour later
    report = verify(late, signer, max_gap_s=7200)
    assert ("unsealed_overdue", chain, 1) in codes_at(report)
    assert "but the writer signs within 20.0 s" in str(report.errors)


def test_records_after_the_tail_a_successor_recorded_fail(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    first = _crashed_writer(url, signer, "gw-0", 2)
    write_log(url, signer, 2, replica="gw-0")  # the restart: names first's 3 records
    _append_forged(url, first, 2)
    report = verify(url, signer)
    assert ("unsealed_overdue", first, 3) in codes_at(report)


def test_hostile_chain_id_is_reported_and_escaped(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    write_log(url, signer, 3, replica="gw-0")
    bad = "gw-0/20261205T000000Z-aaaaaaaa\x1b[2K\rOK: no tampering found\x1b[8m\nOK"
    for table in ("audit_records", "audit_checkpoints", "audit_chains"):
        raw_sql(url, f"UPDATE {table} SET chain = ?", bad)  # noqa: S608 (fixed names)
    out = gateway("audit", "verify", "--store", url, "--public-key", _pub(tmp_path, signer))
    assert out.exit_code == 1
    assert "\r" not in out.output and "\x1b" not in out.output
    lines = out.output.splitlines()
    assert not any(line.startswith("OK") for line in lines), lines
    shown = json.dumps(bad)
    assert f"  ERROR malformed_chain_id [{shown}]: chain id is not " in out.output
    doc = json.loads(gateway("audit", "verify", "--store", url, "--public-key",
                             _pub(tmp_path, signer), "--json").output)
    assert ("malformed_chain_id", bad) in {(f["code"], f["chain"]) for f in doc["findings"]}


def test_tail_escapes_a_hostile_chain_id_and_type(tmp_path: Path, signer: Signer) -> None:
    url = f"sqlite://{tmp_path / 'a.db'}"
    write_log(url, signer, 1, replica="gw-0")
    raw_sql(url, "UPDATE audit_records SET chain = ?, type = ?", "gw-0/x\rOK", "t\x1b[8m")
    out = gateway("audit", "tail", "--store", url, "-n", "1")
    assert out.exit_code == 0, out.output
    assert "\r" not in out.output and "\x1b" not in out.output
    assert '"gw-0/x\\rOK"#' in out.output and '"t\\u001b[8m"' in out.output


def test_verify_proof_refuses_a_chain_id_not_of_the_writers_form(
        tmp_path: Path, signer: Signer) -> None:
    # Signed by the trusted key (a writer given an unchecked replica id): still refused, and
    # the id is shown escaped, never raw.
    url = f"sqlite://{tmp_path / 'a.db'}"

    async def run() -> None:
        async with AuditLog(open_store(url), signer, replica_id="gw-0\rOK") as log:
            await log.append({"type": "request.started", "request_id": "req-1"})

    asyncio.run(run())
    bundle = tmp_path / "proof.json"
    assert gateway("audit", "prove", "req-1", "--store", url, "--out", str(bundle)).exit_code == 0
    out = gateway("audit", "verify-proof", str(bundle), "--public-key", _pub(tmp_path, signer))
    assert out.exit_code != 0
    assert "\r" not in out.output
    assert "proof entry 0: the record's chain id 'gw-0\\rOK/" in out.output, out.output
