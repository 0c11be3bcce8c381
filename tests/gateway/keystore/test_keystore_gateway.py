"""Managed keys through the real gateway: two replicas share one key store (SQLite and
PostgreSQL); a key revoked by the admin is refused by both within the propagation bound."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from gateway.app import create_app
from gateway.keystore import KeyManager, open_keystore
from gateway.keystore.auth import managed_authenticator
from tests.gateway.helpers import KEY_A, settings, start_sim

MODEL = "llama-3.1-8b"
REFRESH_S = 0.3

_OPEN: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def sdk(url: str, key: str) -> openai.OpenAI:
    c = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
    _OPEN.append(c)
    return c


def chat(url: str, key: str) -> Any:
    return sdk(url, key).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )


def replicas(serve_asgi: Callable[..., Any], store_url: str, n: int = 2) -> list[str]:
    sim = start_sim(serve_asgi)
    cfg = settings([sim.url])
    cfg = cfg.model_copy(
        update={"audit": {"store": store_url}, "keystore": {"refresh_s": REFRESH_S}}
    )
    urls = []
    for _ in range(n):
        auth = managed_authenticator(cfg)
        assert auth is not None
        urls.append(str(serve_asgi(create_app(cfg, authenticator=auth)).url))
    return urls


def admin(store_url: str, action: Callable[[KeyManager], Any]) -> Any:
    """Run one admin action in its own event loop, closing the store afterwards."""

    async def run() -> Any:
        mgr = KeyManager(open_keystore(store_url), audit=None, actor="test")
        try:
            return await action(mgr)
        finally:
            await mgr.store.close()

    return asyncio.run(run())


def test_managed_key_works_everywhere_and_revocation_propagates(
    store_url: str, serve_asgi: Callable[..., Any]
) -> None:
    issued = admin(store_url, lambda m: m.create(team="a", models=[MODEL], key_id="managed-1"))
    r1, r2 = replicas(serve_asgi, store_url)
    assert chat(r1, issued.token).choices and chat(r2, issued.token).choices
    assert chat(r1, KEY_A).choices  # config keys keep working
    # The key may only use its models: another model is 403 like for config keys.
    with pytest.raises(openai.PermissionDeniedError):
        sdk(r1, issued.token).chat.completions.create(
            model="other-model", messages=[{"role": "user", "content": "x"}]
        )

    admin(store_url, lambda m: m.revoke("managed-1"))
    t0 = time.monotonic()
    refused = set()
    while refused != {r1, r2}:
        for url in (r1, r2):
            if url in refused:
                continue
            try:
                chat(url, issued.token)
            except openai.AuthenticationError as exc:
                assert exc.status_code == 401
                assert exc.body["code"] == "invalid_api_key"  # type: ignore[index]
                refused.add(url)
        assert time.monotonic() - t0 < REFRESH_S + 3.0, "revocation did not propagate"
        time.sleep(0.05)
    assert chat(r2, KEY_A).choices


def test_rotated_key_grace_through_the_gateway(
    store_url: str, serve_asgi: Callable[..., Any]
) -> None:
    old = admin(store_url, lambda m: m.create(team="a", models=["*"], key_id="rot"))
    (r1,) = replicas(serve_asgi, store_url, n=1)
    new = admin(store_url, lambda m: m.rotate("rot", grace_s=0.5))
    t0 = time.monotonic()
    while True:  # the new key becomes valid within the refresh period
        try:
            chat(r1, new.token)
            break
        except openai.AuthenticationError:
            assert time.monotonic() - t0 < REFRESH_S + 3.0
            time.sleep(0.05)
    time.sleep(max(0.0, 0.6 - (time.monotonic() - t0)))
    with pytest.raises(openai.AuthenticationError):
        chat(r1, old.token)  # the grace period is over
    assert chat(r1, new.token).choices
