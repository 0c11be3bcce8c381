"""The streaming checks of one chain's records, in stored order: hash, canonical form, chain,
sequence (gaps, reordering, insertion), links, start record, time gaps and the unhashed columns;
and the Merkle roots at the sizes the chain's checkpoints claim (:class:`ChainScan`).

:func:`gateway.audit.verify.verify_store` feeds it a page at a time and compares what it
collected with the checkpoints.
"""

from __future__ import annotations

from typing import Any

from gateway.audit.errors import AuditFormatError
from gateway.audit.merkle import CompactRange
from gateway.audit.records import (
    CHAIN_STARTED,
    GENESIS_PREV,
    Record,
    canonical_json,
    parse_body,
    record_hash,
)
from gateway.audit.verify_report import Findings


class ChainScan:
    """Streaming per-record checks of one chain (positions are the stored seq column)."""

    def __init__(self, chain: str, v: Findings, gap_us: int | None, wanted: set[int]) -> None:
        self.chain, self.v, self.gap_us, self.wanted = chain, v, gap_us, wanted
        self.rng = CompactRange()
        self.roots: dict[int, bytes] = {}
        self.hashes_at: dict[int, bytes] = {}
        self.ts_at: dict[int, int] = {}  # size -> ts_us of the record that makes it that size
        self.expected = 0
        self.offset = 0
        self.prev = bytes.fromhex(GENESIS_PREV)  # recomputed hash of the previous row
        self.prev_stored = self.prev  # its stored hash
        self.prev2 = self.prev  # recomputed hash of the row before that
        self.prev_seq: int | None = None  # body seq of the previous row
        self.prev_altered = False
        self.link_known = True
        self.prev_ts: int | None = None
        self.last_type: str | None = None

    def err(self, code: str, seq: int, msg: str) -> None:
        """An error finding about this chain at record ``seq``."""
        self.v.add("error", code, self.chain, seq, msg)

    def feed(self, rec: Record) -> None:
        """Check the next stored record ``rec`` and add its hash to the Merkle range."""
        pos = rec.seq
        if not isinstance(pos, int) or isinstance(pos, bool):  # an edit in the store
            self.err("column_mismatch", self.expected,
                     f"stored column seq={pos!r} is not a sequence number: edited outside the "
                     "hash")
            pos = self.expected
        if pos != self.expected:
            self.err(
                "missing_records",
                self.expected,
                f"records {self.expected}..{pos - 1} missing (next stored record is {pos})",
            )
            self.link_known = False
        h = record_hash(rec.body)
        altered = h != rec.hash
        if altered:
            self.err("hash_mismatch", pos, "record content does not match its stored hash")
        obj: dict[str, Any] | None
        try:
            obj = parse_body(rec.body)
            if canonical_json(obj) != rec.body:
                self.err("non_canonical", pos, "record is not canonical JSON")
        except AuditFormatError as exc:
            self.err("malformed_record", pos, str(exc))
            obj = None
        if obj is not None:
            self._check_obj(obj, pos)
            self._check_columns(rec, obj, pos)
        self.prev2, self.prev, self.prev_stored = self.prev, h, rec.hash
        self.prev_altered = altered
        self.expected = pos + 1
        self.rng.append(h)
        if self.rng.size in self.wanted:
            self.roots[self.rng.size] = self.rng.root()
            self.hashes_at[self.rng.size] = h
            if self.prev_ts is not None:
                self.ts_at[self.rng.size] = self.prev_ts

    def _check_columns(self, rec: Record, obj: dict[str, Any], pos: int) -> None:
        """The stored columns outside the hash must repeat the hashed body.

        ``prove`` / ``find_request`` select by ``request_id``, ``tail`` and ``export`` by
        ``ts_us`` and ``type``: an edited column would hide or misattribute a record.
        """
        data = obj.get("data")
        rid = data.get("request_id") if isinstance(data, dict) else None
        expected = {
            "ts_us": obj.get("ts_us"),
            "type": obj.get("type"),
            "request_id": rid if isinstance(rid, str) else None,
        }
        stored = {"ts_us": rec.ts_us, "type": rec.type, "request_id": rec.request_id}
        for name, want in expected.items():
            if stored[name] != want:
                self.err(
                    "column_mismatch",
                    pos,
                    f"stored column {name}={stored[name]!r} differs from the hashed record "
                    f"({want!r}): edited outside the hash",
                )

    def _check_obj(self, obj: dict[str, Any], pos: int) -> None:
        if obj["chain"] != self.chain:
            self.err("wrong_chain", pos, f"record claims chain {obj['chain']}")
        seq = obj["seq"]
        misplaced = seq != pos
        if misplaced and seq - pos != self.offset:
            self.err("out_of_order", pos, f"record at position {pos} carries seq {seq}")
        self.offset = seq - pos
        prev = obj["prev"]
        if prev != self.prev.hex() and self.link_known:
            if seq == self.prev_seq and prev == self.prev2.hex():
                self.err(
                    "inserted_record",
                    pos - 1,
                    f"record at position {pos - 1} duplicates seq {seq} and is not linked "
                    "from its successor (inserted)",
                )
            elif not (self.prev_altered and prev == self.prev_stored.hex()) and not misplaced:
                self.err(
                    "broken_link",
                    pos,
                    f"prev does not match the hash of record {pos - 1} (one was altered)",
                )
        self.link_known = True
        if pos == 0 and obj["type"] != CHAIN_STARTED:
            self.err("missing_start", 0, "chain does not begin with chain.started")
        ts = obj["ts_us"]
        if self.prev_ts is not None and self.gap_us is not None and ts - self.prev_ts > self.gap_us:
            self.err(
                "time_gap",
                pos,
                f"{(ts - self.prev_ts) / 1e6:.1f} s since the previous record exceeds the "
                f"{self.gap_us / 1e6:.1f} s heartbeat bound (records deleted or writer "
                "stalled)",
            )
        self.prev_ts = ts
        self.prev_seq = seq
        self.last_type = obj["type"]
