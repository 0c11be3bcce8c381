"""Three ``gateway serve`` processes sharing Redis under a concurrent burst, and a Redis outage
through the gateway (fail closed: 503 and the backend is never called; fail open: admitted and
recorded in the real audit log)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import yaml

from gateway.app import create_app
from gateway.audit import AuditLog, open_store
from gateway.audit.checkpoint import Signer
from gateway.quotas.hook import QuotaHook
from tests.conftest import free_port
from tests.gateway.helpers import KEY_A, config, settings, start_sim, stop_processes

ROOT = Path(__file__).resolve().parents[3]
REDIS_URL = "redis://127.0.0.1:6379/0"
MODEL = "llama-3.1-8b"
RPM = 40



@pytest.fixture
def gateways(
    tmp_path: Path, redis_prefix: str, serve_asgi: Callable[..., Any]
) -> Iterator[list[str]]:
    """Three gateway OS processes (``gateway serve``) with quotas in the shared Redis."""
    sim = start_sim(serve_asgi)
    cfg = config([sim.url])
    for model in cfg["models"]:
        model["replicas"] = [{"url": r["url"]} for r in model["replicas"]]
    cfg["quotas"] = {
        "backend": "redis",
        "redis_url": REDIS_URL,
        "key_prefix": redis_prefix,
        "defaults": {"key": {"requests_per_minute": RPM}},
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(3):
        port = free_port()
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from gateway.cli import main; sys.exit(main())",
                    "serve",
                    "--config",
                    str(path),
                    "--port",
                    str(port),
                ],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
        urls.append(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        for url, proc in zip(urls, procs, strict=True):
            while True:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                try:
                    if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "gateway did not start"
                time.sleep(0.1)
        yield urls
    finally:
        stop_processes(procs, 10)


def redis_time() -> float:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        sec, usec = client.time()
        return float(sec) + usec / 1e6
    finally:
        client.close()


def test_three_gateway_processes_share_the_limit(gateways: list[str]) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    async def burst() -> list[tuple[int, str | None]]:
        async with httpx.AsyncClient(
            timeout=30, headers={"authorization": f"Bearer {KEY_A}"}, trust_env=False
        ) as client:
            sem = asyncio.Semaphore(24)

            async def one(i: int) -> tuple[int, str | None]:
                async with sem:
                    r = await client.post(gateways[i % 3] + "/v1/chat/completions", json=body)
                    return r.status_code, r.headers.get("x-ratelimit-limit-requests")

            return await asyncio.gather(*(one(i) for i in range(150)))

    t0 = redis_time()
    answers = asyncio.run(burst())
    elapsed = redis_time() - t0
    statuses = [status for status, _ in answers]
    # Admitted and refused answers both tell the client its limit (x-ratelimit-* headers).
    assert {limit for _, limit in answers} == {str(RPM)}
    admitted = statuses.count(200)
    assert set(statuses) <= {200, 429}, statuses
    # GCRA: at most the limit plus what refills during the burst (tolerance 0 with Redis).
    assert RPM <= admitted <= RPM + RPM * elapsed / 60, (admitted, elapsed)
    assert statuses.count(429) == 150 - admitted


@pytest.fixture
def audit_log(tmp_path: Path) -> Iterator[tuple[AuditLog, str]]:
    store = f"sqlite://{tmp_path / 'audit.db'}"
    log = AuditLog(open_store(store), Signer.generate(), replica_id="quota-test")
    yield log, store


async def _records(store: str) -> list[dict[str, Any]]:
    from gateway.audit import export_records

    st = open_store(store)
    await st.open()
    try:
        return [json.loads(r.body) async for r in export_records(st)]
    finally:
        await st.close()


@pytest.mark.parametrize("policy", ["fail_closed", "fail_open"])
def test_redis_outage_through_the_gateway(
    serve_asgi: Callable[..., Any],
    throwaway_redis: Callable[..., Any],
    audit_log: tuple[AuditLog, str],
    policy: str,
) -> None:
    log, store = audit_log
    srv = throwaway_redis()
    sim = start_sim(serve_asgi)
    cfg = settings([sim.url])
    hook = QuotaHook.from_settings(
        {
            "backend": "redis",
            "redis_url": srv.url,
            "on_backend_error": policy,
            "redis_timeout_s": 0.3,
            "defaults": {"key": {"requests_per_minute": 100}},
        },
        on_event=log.append,
    )

    class StartLog:
        async def startup(self) -> None:
            await log.start()

        async def shutdown(self) -> None:
            await log.close()

        async def on_start(self, record: Any) -> None: ...

        async def on_end(self, record: Any) -> None: ...

    gw = serve_asgi(create_app(cfg, admission=[hook], observers=[StartLog(), hook]))
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY_A, max_retries=0)
    try:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}])
        before = sim.stats()["received"]
        srv.stop()
        if policy == "fail_closed":
            with pytest.raises(openai.InternalServerError) as info:
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "b"}]
                )
            assert info.value.status_code == 503
            assert info.value.body["code"] == "quota_backend_unavailable"  # type: ignore[index]
            assert sim.stats()["received"] == before  # nothing reached the backend
        else:
            r = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "b"}]
            )
            assert r.choices and sim.stats()["received"] == before + 1
        deadline = time.monotonic() + 5  # on_end runs just after the client has the answer
        while hook.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hook.in_flight == 0
    finally:
        client.close()
    gw.stop()
    records = asyncio.run(_records(store))
    outages = [r for r in records if r.get("type") == "quota.backend_unavailable"]
    assert len(outages) == 1, records
    assert json.dumps(outages[0]).count(policy) == 1
