"""With no ``policy:`` section, a replica at the cloud metadata address (or any always-denied
address) is refused at connect time, after resolution, before anything is sent; loopback and
private replicas keep working. Real gateway on loopback, official openai SDK."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.config.loader import parse
from policy import EgressDenied, denied_address_socket_factory
from tests.policy.test_policy_transport import ScriptedResolver
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

KEY = "sk-test-metadata-0123456789"


def _gateway(serve_asgi: Callable[..., Any], tmp_path: Path, urls: list[str]) -> str:
    cfg = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": "m", "replicas": [{"url": u} for u in urls]}],
        "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                  "models": ["m"]}],
        "health": {"active": False},
        "logging": {"access_log": False},
    }
    settings = parse(cfg)
    return str(serve_asgi(create_app(settings, assemble(settings, tmp_path))).url)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=30)


def test_a_metadata_replica_is_refused_without_a_policy(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    url = _gateway(serve_asgi, tmp_path, ["http://169.254.169.254:80"])
    with pytest.raises(openai.APIStatusError) as info:
        _client(url).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    body = info.value.response.json()
    assert body["error"]["code"] == "upstream_egress_denied", body
    assert info.value.status_code == 502
    assert "link-local / cloud metadata (always denied" in body["error"]["message"]


def test_a_loopback_replica_still_works_without_a_policy(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    url = _gateway(serve_asgi, tmp_path, [str(sim.url)])
    resp = _client(url).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert resp.choices


def test_a_name_resolving_to_the_metadata_address_is_refused_before_connecting() -> None:
    """The check runs on the resolved address: a DNS answer of 169.254.169.254 is refused."""
    async def go() -> None:
        resolver = ScriptedResolver({"models.example": [["169.254.169.254"]]})
        connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False,
                                         socket_factory=denied_address_socket_factory())
        async with aiohttp.ClientSession(connector=connector) as s:
            with pytest.raises(EgressDenied, match="cloud metadata"):
                await s.get("http://models.example:80/")
        assert resolver.calls == ["models.example"]

    asyncio.run(go())


def test_the_litellm_client_without_a_policy_refuses_the_metadata_address() -> None:
    """The litellm backend's openai client (no policy): a literal or a name resolving to
    169.254.169.254 is refused before a connection; a loopback name is sent as usual."""
    from gateway.relay.litellm_backend import make_client
    from policy import DeniedAddressAsyncTransport

    async def go() -> None:
        client = make_client("http://169.254.169.254:80", "k")
        with pytest.raises(EgressDenied, match="cloud metadata"):  # gateway maps it (litellm _map)
            await client.models.list()
        await client.close()
        asked: list[str] = []

        def resolver(host: str, port: int) -> list[str]:
            asked.append(host)
            return ["169.254.169.254"]

        import httpx

        async with httpx.AsyncClient(transport=DeniedAddressAsyncTransport(resolver)) as http:
            with pytest.raises(EgressDenied, match=r"resolved to 169\.254\.169\.254"):
                await http.get("http://models.example/")
        assert asked == ["models.example"]

    asyncio.run(go())


def test_the_relay_dialer_refuses_a_name_resolving_to_the_metadata_address() -> None:
    """The relay's own client dials with the same check (no policy: the default dialer)."""
    from gateway.h1 import resolver_dialer

    async def go() -> None:
        resolver = ScriptedResolver({"models.example": [["169.254.169.254"]]})
        dial = resolver_dialer(resolver, denied_address_socket_factory())
        with pytest.raises(EgressDenied, match="cloud metadata"):
            await dial("models.example", 80)
        assert resolver.calls == ["models.example"]

    asyncio.run(go())
