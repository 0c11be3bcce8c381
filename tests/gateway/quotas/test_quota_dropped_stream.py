"""A stream the client drops is charged with an estimate of the tokens relayed so far.

Real gateway and simulator on loopback, the official ``openai`` SDK as client: the client reads
part of a slow stream and closes it; the gateway cancels upstream, has no usage from the backend,
and must charge the key's tokens-per-minute (and budgets) with a positive estimate, marked
``usage_estimated`` on the request record and in the audit log.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
from openai.types.chat import ChatCompletionMessageParam

from gateway.app import create_app
from gateway.audit import (
    AuditSettings,
    Signer,
    generate_key_file,
    open_store,
    write_key_pair,
)
from gateway.audit.observer import build
from gateway.audit.records import parse_body
from gateway.quotas.hook import QuotaHook
from gateway.relay.rewrite import SAMPLE_BYTES, SSEUsageScanner
from tests.gateway.helpers import KEY_A, Recorder, settings, start_sim

MODEL = "llama-3.1-8b"
FROZEN_NOW = 1_900_000_000.0  # the limiter's clock, frozen so TAT arithmetic is exact
TPM = 600
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]
BODY: dict[str, Any] = {"model": MODEL, "messages": MESSAGES}


def test_scanner_counts_data_events_across_chunk_splits() -> None:
    stream = (
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"data: x\\n"}}]}\n\n'
        b": keep-alive comment\n\n"
        b'data: {"choices":[{"delta":{"content":"b"}}]}\r\n\r\n'
        b"data: [DONE]\n\n"
    )
    for size in (1, 3, 7, len(stream)):
        for drop in (False, True):
            sc = SSEUsageScanner(drop_usage_only=drop)
            for i in range(0, len(stream), size):
                sc.feed(stream[i : i + size])
            sc.finish()
            assert sc.data_events == 4, (size, drop)
            assert sc.estimated_output_tokens == 3  # [DONE] is not a token
    half = SSEUsageScanner()
    half.feed(stream[:80])  # one complete event and part of the next
    assert half.estimated_output_tokens == 1


def test_long_streams_are_extrapolated_from_the_sampled_bytes() -> None:
    event = b'data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}\n\n'
    n = 3 * SAMPLE_BYTES // len(event)  # well past the exactly counted sample
    for per_chunk in (1, 5):
        sc = SSEUsageScanner()
        for i in range(0, n, per_chunk):
            sc.feed(event * min(per_chunk, n - i))
        assert sc.data_events < n  # only the sample was counted ...
        assert abs(sc.estimated_output_tokens - n) <= per_chunk  # ... the rest extrapolated
        sc.feed(b"data: [DONE]\n\n")
        assert abs(sc.estimated_output_tokens - n) <= per_chunk + 1


def _wait(pred: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pred()


def test_dropped_stream_charges_an_estimate(serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    sim = start_sim(serve_asgi, itl_s=0.02, tokens_per_response=2000)
    quotas = {"defaults": {"key": {"tokens_per_minute": TPM, "tokens_per_day": 100000}}}
    cfg = settings([sim.url], quotas=quotas)
    hook = QuotaHook.from_settings(cfg.quotas or {})
    limiter: Any = hook.service.limiter
    limiter._clock = lambda: FROZEN_NOW
    recorder = Recorder()
    store_url = f"sqlite://{tmp_path / 'audit.db'}"
    key, _ = write_key_pair(Signer.generate(), tmp_path / "audit.key")
    audit = build(
        AuditSettings.model_validate(
            {
                "store": store_url,
                "signing_key_file": str(key),
                "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key")),
                "replica_id": "gw1",
            }
        ),
        config_digest="ab" * 32,
    )
    assert audit is not None
    app = create_app(cfg, admission=[hook], observers=[audit, recorder, hook])
    srv = serve_asgi(app)
    prompt_estimate = hook.service.estimator.estimate(MODEL, BODY).total
    with openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY_A, max_retries=0) as c:
        stream = c.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        read = 0
        for _ in stream:
            read += 1
            if read == 10:
                break
        stream.close()
    (rec,) = recorder.wait(1)
    _wait(lambda: hook.in_flight == 0)
    assert rec.outcome == "client_disconnect"
    assert rec.usage_estimated is True
    assert rec.output_tokens is not None and rec.output_tokens >= read - 1  # role event
    assert rec.output_tokens < 2000  # cancelled long before the end
    charged = prompt_estimate + rec.output_tokens
    assert limiter.used("key:team-a", "day") == charged
    tat = limiter._tat_tokens["key:team-a"]
    assert round((tat - FROZEN_NOW) * TPM / 60.0) == charged
    done = [r["data"] for r in _records(store_url, rec.request_id)
            if r["type"] == "request.completed"]
    assert len(done) == 1 and done[0]["usage_estimated"] is True
    assert done[0]["output_tokens"] == rec.output_tokens
    assert done[0]["outcome"] == "client_disconnect"


def _records(url: str, request_id: str) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        store = open_store(url, read_only=True)
        await store.open()
        try:
            return [parse_body(r.body) for r in await store.find_request(request_id)]
        finally:
            await store.close()

    return asyncio.run(run())


def test_stream_the_backend_breaks_off_is_charged_per_relayed_event(
    serve_asgi: Callable[..., Any],
) -> None:
    sim = start_sim(serve_asgi, tokens_per_response=50)
    sim.fault(mode="die_mid_stream", after_events=7)
    quotas = {"defaults": {"key": {"tokens_per_day": 100000}}}
    cfg = settings([sim.url], quotas=quotas)
    hook = QuotaHook.from_settings(cfg.quotas or {})
    recorder = Recorder()
    srv = serve_asgi(create_app(cfg, admission=[hook], observers=[recorder, hook]))
    prompt_estimate = hook.service.estimator.estimate(MODEL, BODY).total
    with openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY_A, max_retries=0) as c:
        stream = c.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        try:
            got = sum(1 for _ in stream)
        except openai.APIError:
            got = -1  # the gateway's final error event
    (rec,) = recorder.wait(1)
    _wait(lambda: hook.in_flight == 0)
    assert got == -1 and rec.outcome == "upstream_error"
    assert rec.usage_estimated and rec.output_tokens == 7 and rec.input_tokens is None
    assert hook.service.limiter.used("key:team-a", "day") == prompt_estimate + 7  # type: ignore[attr-defined]
