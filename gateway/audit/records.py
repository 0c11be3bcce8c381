"""Audit record types and the canonical JSON encoding.

A record is a JSON object::

    {"v": 1, "chain": "<chain id>", "seq": <int>, "prev": "<hex sha256>",
     "ts_us": <int, microseconds since the Unix epoch, UTC>, "type": "<record type>",
     "data": {...}}

Canonical form (what is hashed and stored): keys sorted, separators ``,`` and ``:``,
UTF-8 without escaping non-ASCII, integers only (floats, NaN and infinities are rejected), no
whitespace. The record hash is the RFC 6962 leaf hash of the canonical bytes,
``SHA-256(0x00 || canonical_json(record))``, so the hash chain and the Merkle tree share one
hash per record (RFC 6962 section 2.1).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from gateway.audit.errors import AuditFormatError

RECORD_VERSION: Final = 1
GENESIS_PREV: Final = "0" * 64
"""``prev`` of the first record of a chain (64 hex zeros)."""

# Record types. Request records come in pairs sharing ``data.request_id``.
REQUEST_STARTED: Final = "request.started"
REQUEST_COMPLETED: Final = "request.completed"
CHAIN_STARTED: Final = "chain.started"
CHAIN_CLOSED: Final = "chain.closed"
HEARTBEAT: Final = "audit.heartbeat"
EGRESS_DENIED: Final = "egress.denied"
CONFIG_LOADED: Final = "config.loaded"
POLICY_LOADED: Final = "policy.loaded"
KEY_CREATED: Final = "key.created"
KEY_REVOKED: Final = "key.revoked"

OUTCOMES: Final = frozenset({"ok", "upstream_error", "client_disconnect", "denied", "error"})

_TOP_KEYS: Final = frozenset({"v", "chain", "seq", "prev", "ts_us", "type", "data"})


_PLAIN: Final = frozenset({type(None), bool, int, str})
_PLAIN_NODES: Final = 10_000
"""Most containers :func:`_plain` walks before leaving the value to :func:`_check_value`
(a deeper or self-referencing value gets the full check and its error)."""


def _plain(value: Any) -> bool:
    """True when ``value`` is made only of ``dict`` (``str`` keys), ``list``, ``tuple``,
    ``str``, ``int``, ``bool`` and ``None``, each of exactly that type: a quick test, without
    recursion, that can only accept what :func:`_check_value` accepts (``False`` leaves the
    value to it: subclasses, other mappings, errors)."""
    plain = _PLAIN
    stack = [value]
    budget = _PLAIN_NODES
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in plain:
            continue
        budget -= 1
        if budget < 0:
            return False
        if kind is dict:
            for key, inner in item.items():
                if type(key) is not str:
                    return False
                if type(inner) not in plain:
                    stack.append(inner)
        elif kind is list or kind is tuple:
            stack.extend(item)
        else:
            return False
    return True


def _check_value(value: Any, path: str) -> None:
    if value is None or isinstance(value, bool | int | str):
        return
    if isinstance(value, float):
        raise AuditFormatError(f"{path}: floats are not allowed in audit records (use integers)")
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_value(item, f"{path}[{i}]")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise AuditFormatError(f"{path}: object keys must be strings, got {key!r}")
            _check_value(item, f"{path}.{key}")
        return
    raise AuditFormatError(f"{path}: unsupported type {type(value).__name__} in audit record")


def canonical_json(value: Any) -> bytes:
    """Encode ``value`` as canonical JSON.

    Args:
        value: JSON-compatible data made of dicts with str keys, lists, str, int, bool, None.

    Returns:
        UTF-8 bytes with sorted keys and no insignificant whitespace.

    Raises:
        AuditFormatError: On floats, non-string keys or unsupported types.
    """
    if not _plain(value):
        _check_value(value, "$")
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def record_hash(body: bytes) -> bytes:
    """Return the 32-byte record hash: the RFC 6962 leaf hash ``SHA-256(0x00 || body)``."""
    return hashlib.sha256(b"\x00" + body).digest()


@dataclass(frozen=True, slots=True)
class Record:
    """One stored audit record.

    Attributes:
        chain: Chain id (also the checkpoint origin).
        seq: 0-based position in the chain (the Merkle leaf index).
        body: Canonical JSON bytes as hashed.
        hash: 32-byte record hash (``record_hash(body)``).
        ts_us: Record time, microseconds since the Unix epoch (copied from the body).
        type: Record type, e.g. ``request.started``.
        request_id: ``data.request_id`` for request records, else ``None``.
    """

    chain: str
    seq: int
    body: bytes
    hash: bytes
    ts_us: int
    type: str
    request_id: str | None

    def decoded(self) -> dict[str, Any]:
        """Return the parsed JSON body.

        Raises:
            AuditFormatError: If the body is not a JSON object.
        """
        return parse_body(self.body)


def parse_body(body: bytes) -> dict[str, Any]:
    """Parse and structurally check a record body.

    Args:
        body: Record bytes as stored.

    Returns:
        The JSON object.

    Raises:
        AuditFormatError: If the bytes are not UTF-8 JSON of the record shape.
    """
    try:
        obj = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise AuditFormatError(f"record is not UTF-8 JSON: {exc}") from exc
    if not isinstance(obj, dict) or set(obj) != _TOP_KEYS:
        keys = ",".join(sorted(_TOP_KEYS))
        raise AuditFormatError(f"record does not have exactly the keys {keys}")
    if not isinstance(obj["seq"], int) or not isinstance(obj["ts_us"], int):
        raise AuditFormatError("record seq and ts_us must be integers")
    if not isinstance(obj["data"], dict):
        raise AuditFormatError("record data must be an object")
    return obj


def make_record(
    *, chain: str, seq: int, prev: bytes, ts_us: int, type_: str, data: Mapping[str, Any]
) -> Record:
    """Build a record in canonical form.

    Args:
        chain: Chain id.
        seq: Sequence number (0-based).
        prev: 32-byte hash of the previous record, or 32 zero bytes for ``seq == 0``.
        ts_us: Microseconds since the Unix epoch.
        type_: Record type.
        data: Event fields (JSON values, integers only).

    Returns:
        The record with its canonical bytes and hash.

    Raises:
        AuditFormatError: If ``data`` holds floats or unsupported values.
    """
    obj = {
        "v": RECORD_VERSION,
        "chain": chain,
        "seq": seq,
        "prev": prev.hex(),
        "ts_us": ts_us,
        "type": type_,
        "data": dict(data),
    }
    body = canonical_json(obj)
    request_id = data.get("request_id")
    return Record(
        chain=chain,
        seq=seq,
        body=body,
        hash=record_hash(body),
        ts_us=ts_us,
        type=type_,
        request_id=request_id if isinstance(request_id, str) else None,
    )
