"""The httpx policy transport, with the official openai SDK as client, against real uvicorn."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest
from test_policy_transport import recording_app

from policy import (
    EgressDenied,
    EgressGuard,
    PinStore,
    Policy,
    RedirectRefused,
    make_httpx_client,
)
from vllm_sim import SimConfig, create_app


def _policy(port: int) -> Policy:
    dest = "region: lo, jurisdiction: EU, operator: me"
    return Policy.from_text(
        "version: 1\ndata_classes: [public]\ndestinations:\n"
        f"  - {{id: ip, url: 'http://127.0.0.1:{port}', {dest}}}\n"
        f"  - {{id: sim, host: Sim.Internal, port: {port}, {dest}, resolves_to: [127.0.0.0/8]}}\n"
    )


class Script:
    def __init__(self, *answers: list[str]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        return self.answers.pop(0)


def test_openai_sdk_through_pinned_hostname(serve_asgi: Callable[..., Any]) -> None:
    srv = serve_asgi(create_app(SimConfig(models=["m"])))
    resolver = Script(["127.0.0.1"], ["127.0.0.66"])
    events: list[Any] = []
    guard = EgressGuard(_policy(srv.port), on_event=events.append)

    async def run() -> list[str]:
        http = make_httpx_client(guard.matcher, resolver=resolver)
        client = openai.AsyncOpenAI(base_url=f"http://SIM.internal.:{srv.port}/v1",
                                    api_key="sk-local", http_client=http, max_retries=0)
        out = []
        for _ in range(2):
            resp = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            out.append(resp.choices[0].message.content or "")
        await client.close()
        return out

    with guard:
        answers = asyncio.run(run())
    assert all(answers)
    assert resolver.calls == [("sim.internal", srv.port)]  # once; the rebound answer unused
    assert events == []


def test_host_header_kept_and_redirect_refused(serve_asgi: Callable[..., Any]) -> None:
    seen: list[dict[str, str]] = []
    srv = serve_asgi(recording_app(seen))

    async def run() -> None:
        async with make_httpx_client(_policy(srv.port), resolver=Script(["127.0.0.1"])) as c:
            r = await c.get(f"http://sim.internal:{srv.port}/a")
            assert r.status_code == 200 and r.text == f"sim.internal:{srv.port}"
            with pytest.raises(RedirectRefused, match="302 redirect to '/target'"):
                await c.get(f"http://sim.internal:{srv.port}/redirect")

    asyncio.run(run())
    assert [s["path"] for s in seen] == ["/a", "/redirect"]


@pytest.mark.parametrize(
    ("url_host", "port", "answer", "reason"),
    [
        ("elsewhere.example", 1, None, "no destination names elsewhere.example"),
        ("sim.internal", 1, ["169.254.169.254"], "outside resolves_to"),
        ("sim.internal", 2, None, "no destination names sim.internal:2"),
        ("2130706433", 2, None, "no destination allows 127.0.0.1:2"),
    ],
)
def test_refusals(url_host: str, port: int, answer: list[str] | None, reason: str) -> None:
    resolver = Script(*([answer] if answer else []))
    pins = PinStore()

    async def run() -> None:
        async with make_httpx_client(_policy(1), resolver=resolver, pins=pins) as c:
            await c.get(f"http://{url_host}:{port}/")

    with pytest.raises(EgressDenied, match=reason):
        asyncio.run(run())
    assert pins.get("sim.internal") is None
    if answer is None:
        assert resolver.calls == []


def test_proxy_variables_ignored(
    serve_asgi: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, str]] = []
    proxy_seen: list[dict[str, str]] = []
    srv = serve_asgi(recording_app(seen))
    proxy = serve_asgi(recording_app(proxy_seen))
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    monkeypatch.setenv("ALL_PROXY", proxy.url)

    async def run() -> int:
        async with make_httpx_client(_policy(srv.port)) as c:
            return (await c.get(f"http://127.0.0.1:{srv.port}/direct")).status_code

    assert asyncio.run(run()) == 200
    assert [s["path"] for s in seen] == ["/direct"] and proxy_seen == []
    with pytest.raises(ValueError, match="follow_redirects"):
        make_httpx_client(_policy(1), follow_redirects=True)
    assert isinstance(make_httpx_client(_policy(1)), httpx.AsyncClient)
