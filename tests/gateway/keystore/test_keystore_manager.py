"""Managed keys on SQLite and PostgreSQL: create, list, revoke, rotate, audit, cache."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from gateway.keystore import (
    KeyExists,
    KeyManager,
    KeyNotFound,
    KeyStateError,
    KeystoreConfigError,
    KeystoreUnavailable,
    ManagedKeyCache,
    open_keystore,
)

pytestmark = pytest.mark.anyio


async def table_dump(url: str) -> bytes:
    """Every byte of every keystore table, to search for leaked secrets."""
    tables = ("sg_managed_keys", "sg_managed_key_secrets")
    if url.startswith("sqlite://"):
        conn = sqlite3.connect(url[len("sqlite://") :])
        try:
            rows = [r for t in tables for r in conn.execute(f"SELECT * FROM {t}")]  # noqa: S608
        finally:
            conn.close()
        return repr(rows).encode() + Path(url[len("sqlite://") :]).read_bytes()
    pg = await asyncpg.connect(url)
    try:
        rows = [tuple(r) for t in tables for r in await pg.fetch(f"SELECT * FROM {t}")]  # noqa: S608
    finally:
        await pg.close()
    return repr(rows).encode()


async def test_create_stores_only_the_digest_and_audits(store_url: str, events: Any) -> None:
    mgr = KeyManager(open_keystore(store_url), audit=events, actor="alice")
    issued = await mgr.create(team="search", models=["llama", "llama"], expires_in_s=3600)
    token = issued.token
    assert token.startswith("sg-") and len(token) == 46
    key = issued.key
    assert key.id.startswith("key-") and key.team == "search" and key.models == ("llama",)
    assert key.expires_at == key.created_at + 3_600_000
    assert key.secrets[0].digest == hashlib.sha256(token.encode()).hexdigest()
    dump = await table_dump(store_url)
    assert token.encode() not in dump and token[3:].encode() not in dump
    assert key.secrets[0].digest.encode() in dump
    assert events.items == [
        {
            "type": "key.created",
            "key_id": key.id,
            "team": "search",
            "models": ["llama"],
            "data_class": "internal",
            "expires_at_ms": key.expires_at,
            "actor": "alice",
            "source": "keystore",
        }
    ]
    assert all(token not in repr(e) for e in events.items)
    listed = await mgr.list()
    assert [k.id for k in listed] == [key.id] and listed[0].status(key.created_at) == "active"
    await mgr.store.close()


async def test_no_change_without_a_durable_audit_record(store_url: str, events: Any) -> None:
    mgr = KeyManager(open_keystore(store_url), audit=events)
    kept = await mgr.create(team=None, models=["*"], key_id="kept")
    events.fail = True
    with pytest.raises(RuntimeError, match="audit store unavailable"):
        await mgr.create(team=None, models=["*"], key_id="ghost")
    with pytest.raises(RuntimeError):
        await mgr.revoke("kept")
    with pytest.raises(RuntimeError):
        await mgr.rotate("kept")
    keys = await mgr.list()
    assert [k.id for k in keys] == ["kept"]
    assert keys[0].revoked_at is None and keys[0].secrets == kept.key.secrets
    await mgr.store.close()


async def test_errors_are_precise_and_unaudited(store_url: str, events: Any) -> None:
    mgr = KeyManager(open_keystore(store_url), audit=events)
    await mgr.create(team="t", models=["m"], key_id="dup")
    n = len(events.items)
    with pytest.raises(KeyNotFound):
        await mgr.revoke("nope")
    with pytest.raises(KeyNotFound):
        await mgr.rotate("nope")
    with pytest.raises(KeystoreConfigError):
        await mgr.create(team="t", models=[], key_id="x")
    with pytest.raises(KeystoreConfigError):
        await mgr.create(team="t", models=["m"], key_id="../etc")
    assert len(events.items) == n
    with pytest.raises(KeyExists):
        await mgr.create(team="t", models=["m"], key_id="dup")
    # The duplicate was audited as intended, then as failed.
    assert [e["type"] for e in events.items[n:]] == ["key.created", "key.action_failed"]
    assert events.items[-1]["error_code"] == "key_exists"
    await mgr.revoke("dup")
    with pytest.raises(KeyStateError):
        await mgr.revoke("dup")
    with pytest.raises(KeyStateError):
        await mgr.rotate("dup")
    await mgr.store.close()


async def test_rotation_keeps_both_secrets_valid_during_grace(
    store_url: str, events: Any, clock: Any
) -> None:
    wall = clock(time.time())
    mgr = KeyManager(open_keystore(store_url), audit=events, clock=wall)
    old = await mgr.create(team="t", models=["m"], key_id="rot")
    new = await mgr.rotate("rot", grace_s=600)
    assert new.token != old.token and new.key.id == "rot"
    assert len(new.key.secrets) == 2 and new.key.status(int(wall.now * 1000)) == "rotating"
    assert events.items[-1]["type"] == "key.rotated"
    assert events.items[-1]["grace_until_ms"] == int(wall.now * 1000) + 600_000
    cache = ManagedKeyCache(open_keystore(store_url), clock=wall)
    await cache.start()
    try:
        assert cache.lookup(old.token) is not None and cache.lookup(new.token) is not None
        wall.now += 599
        assert cache.lookup(old.token) is not None
        wall.now += 2  # the grace period is over: only the new key works
        assert cache.lookup(old.token) is None
        hit = cache.lookup(new.token)
        assert hit is not None and hit.id == "rot"
    finally:
        await cache.stop()
    await mgr.store.close()


async def test_expired_keys_are_refused_at_lookup_time(
    store_url: str, events: Any, clock: Any
) -> None:
    wall = clock(time.time())
    mgr = KeyManager(open_keystore(store_url), audit=events, clock=wall)
    issued = await mgr.create(team="t", models=["m"], expires_in_s=60)
    cache = ManagedKeyCache(open_keystore(store_url), clock=wall)
    await cache.start()
    try:
        assert cache.lookup(issued.token) is not None
        wall.now += 61
        assert cache.lookup(issued.token) is None
        with pytest.raises(KeyStateError, match="expired"):
            await mgr.rotate(issued.key.id)
    finally:
        await cache.stop()
    await mgr.store.close()


async def test_revocation_propagates_to_another_replica(store_url: str, events: Any) -> None:
    admin = KeyManager(open_keystore(store_url), audit=events)
    issued = await admin.create(team="t", models=["m"])
    other = await admin.create(team="t", models=["m"])
    replica = ManagedKeyCache(open_keystore(store_url), refresh_s=0.2)
    await replica.start()
    try:
        assert replica.lookup(issued.token) is not None
        await admin.revoke(issued.key.id)
        t0 = time.monotonic()
        while replica.lookup(issued.token) is not None:
            assert time.monotonic() - t0 < 5.0, "revocation did not propagate"
            await asyncio.sleep(0.02)
        assert replica.lookup(other.token) is not None  # others are untouched
        assert replica.lookup("sg-" + "A" * 43) is None
    finally:
        await replica.stop()
    await admin.store.close()


async def test_stale_cache_refuses_instead_of_missing_revocations(
    tmp_path: Path, events: Any, clock: Any
) -> None:
    db_dir = tmp_path / "db"
    db_dir.mkdir()
    url = f"sqlite://{db_dir / 'audit.db'}"
    issued = await KeyManager(open_keystore(url), audit=events).create(team=None, models=["m"])
    mono = clock(1000.0)
    cache = ManagedKeyCache(open_keystore(url), refresh_s=3600, max_stale_s=30, monotonic=mono)
    await cache.start()
    try:
        db_dir.rename(tmp_path / "gone")  # the store becomes unreadable
        with pytest.raises(KeystoreUnavailable):
            await cache.refresh()
        mono.now += 29
        assert cache.lookup(issued.token) is not None
        mono.now += 2
        with pytest.raises(KeystoreUnavailable):
            cache.lookup(issued.token)
        (tmp_path / "gone").rename(db_dir)
        await cache.refresh()
        assert cache.lookup(issued.token) is not None
    finally:
        await cache.stop()


def test_unsupported_store_url() -> None:
    with pytest.raises(KeystoreConfigError):
        open_keystore("mysql://x")
    with pytest.raises(KeystoreConfigError):
        open_keystore("sqlite://")
