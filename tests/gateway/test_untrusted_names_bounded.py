"""Client-chosen model names never become metric series or span names, nor big attributes.

An authenticated client may send any ``model``: on ``/v1/chat/completions``, on
``GET /v1/models/{id}``. Before, each distinct unknown name added a series to every model
instrument (200 names: /metrics 71 -> 3,890 series) and one 200 KB name made /metrics 3.8 MB.
Now only configured names are label values and anything else is ``_OTHER``
(:mod:`gateway.bounded`). Real gateway and simulator on loopback, the official openai SDK.
"""

from __future__ import annotations

import hashlib
import io
import json
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.bounded import OTHER, PREFIX_CHARS, bounded
from gateway.telemetry import Telemetry, TelemetrySettings
from tests.gateway.helpers import KEY_A, Sim, settings, start_sim
from tests.gateway.test_batch_api import client as batch_client
from tests.gateway.test_batch_api import settings as batch_settings
from tests.gateway.test_batch_api import wait_batch

CONFIGURED = {"llama-3.1-8b", "other-model", "", OTHER}


def _series(text: str) -> list[Any]:
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def _model_values(text: str) -> set[str]:
    return {s.labels["gen_ai_request_model"] for s in _series(text)
            if "gen_ai_request_model" in s.labels}


def _unknown(client: openai.OpenAI, name: str) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=name, max_tokens=1,
                                       messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(name[:4000])  # a URL path: httpx refuses 64 KB


def test_unknown_model_names_fold_into_one_label_and_bounded_spans(
    serve_asgi: Callable[..., Any], sim: Sim
) -> None:
    exporter = InMemorySpanExporter()
    tel = Telemetry(TelemetrySettings.model_validate({"admin": {"port": 0}}),
                    span_exporter=exporter)
    s = settings([sim.url])
    url = serve_asgi(create_app(s, assemble(s, telemetry=tel))).url
    metrics = f"http://127.0.0.1:{tel.admin.port}/metrics"
    with openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0, timeout=20) as c:
        c.chat.completions.create(model="default", max_tokens=2,
                                  messages=[{"role": "user", "content": "hi"}])
        _unknown(c, f"evil-{secrets.token_hex(8)}")
        before = _series(httpx.get(metrics, timeout=5).text)
        for _ in range(20):
            _unknown(c, f"evil-{secrets.token_hex(8)}")
        huge = "h" * 200_000
        _unknown(c, huge)
    text = httpx.get(metrics, timeout=5).text
    after = _series(text)

    assert _model_values(text) <= CONFIGURED and OTHER in _model_values(text)
    assert "evil-" not in text and "hhhhhhhhhh" not in text
    # Same instruments, same label sets: only the counts grew.
    assert {(x.name, tuple(sorted(x.labels.items()))) for x in after} == \
        {(x.name, tuple(sorted(x.labels.items()))) for x in before}
    assert len(text) < 200_000

    spans = exporter.get_finished_spans()
    assert {sp.name for sp in spans} >= {"chat default", f"chat {OTHER}", f"models {OTHER}"}
    assert not any("evil-" in sp.name or "hhhh" in sp.name for sp in spans)
    for sp in spans:
        for key in ("gen_ai.request.model", "url.path"):
            value = str((sp.attributes or {}).get(key, ""))
            assert len(value) <= 10 * PREFIX_CHARS + 60, (sp.name, key, len(value))
    digest = hashlib.sha256(huge.encode()).hexdigest()[:16]
    assert any(f"sha256={digest}" in str((sp.attributes or {}).get("gen_ai.request.model"))
               for sp in spans)


def test_bounded_keeps_short_printable_text_and_digests_the_rest() -> None:
    assert bounded("llama-3.1-8b") == "llama-3.1-8b"
    assert bounded(None) is None
    long = "x" * 100
    out = bounded(long)
    assert out is not None and out.startswith("x" * PREFIX_CHARS + "…[len=100 sha256=")
    assert out.endswith(hashlib.sha256(long.encode()).hexdigest()[:16] + "]")
    escaped = bounded("a\nb\x1b[31m")
    assert escaped is not None and "\n" not in escaped and "\x1b" not in escaped
    assert escaped.startswith("a\\nb\\x1b[31m…[len=")
    assert len(bounded("\U0001f600" * 10_000) or "") <= 10 * PREFIX_CHARS + 60


def test_batch_lines_with_unknown_models_add_no_series(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    sim = start_sim(serve_asgi)
    tel = Telemetry(TelemetrySettings.model_validate({"admin": {"port": 0}}))
    s = batch_settings(sim.url, tmp_path / "batch.db")
    url = str(serve_asgi(create_app(s, assemble(s, telemetry=tel))).url)
    c = batch_client(url, "owner")
    lines = b"".join(json.dumps({
        "custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": f"bl-{secrets.token_hex(8)}", "max_tokens": 1,
                 "messages": [{"role": "user", "content": "x"}]}}).encode() + b"\n"
        for i in range(5))
    f = c.files.create(file=("in.jsonl", io.BytesIO(lines)), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                         completion_window="24h")
    b = wait_batch(c, b.id, lambda b: b.status in ("completed", "failed"))
    assert b.request_counts is not None and b.request_counts.failed == 5
    text = httpx.get(f"http://127.0.0.1:{tel.admin.port}/metrics", timeout=5).text
    assert "bl-" not in text
    assert OTHER in _model_values(text) <= {OTHER, "m", ""}  # "m": the configured model
