"""Sensitive data in prompts, end to end: the policy's ``pii`` section in a real gateway.

Three simulators are the replicas ``us``, ``eu-b`` and ``eu-a`` (EU, ``no-retention``); the
policy sends ``confidential`` only to ``eu-a`` and ``public`` anywhere (tests/gateway/
egress_testdata.py). The ``pii`` section raises a request with an IBAN or a national id to
``confidential``, refuses cards, masks for the research team, and fails closed for
``confidential``
when the detector fails. The official openai SDK is the client, on loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.audit import Signer, generate_key_file, write_key_pair
from gateway.config.loader import parse
from gateway.egress import start_egress
from tests.conftest import free_port
from tests.gateway.egress_testdata import KEYS, gateway_config, policy_text
from tests.gateway.helpers import audit_export
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

ROOT = Path(__file__).parents[2]
IBAN = "DE89 3704 0044 0532 0130 00"
CARD = "4111 1111 1111 1111"

PII = """\
pii:
  default_class: confidential
  entity_classes: {EMAIL_ADDRESS: internal}
  fail_closed_classes: [confidential]
  timeout_s: %s
  inline_max_chars: %s
  responses: record
  rules:
    - {id: no-cards, entities: [CREDIT_CARD], action: refuse}
    - {id: research-masks, teams: [research], action: mask}
"""


class Stack:
    def __init__(self, url: str, sims: dict[str, Any], audit_db: Path) -> None:
        self.url, self.sims, self.audit_db = url, sims, audit_db

    def client(self, who: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEYS[who], max_retries=0,
                             timeout=30)

    def received(self) -> dict[str, int]:
        return {name: app.state.received for name, app in self.sims.items()}

    def audit_requests(self) -> list[dict[str, Any]]:
        """The ``data`` of every request record (``gateway audit export``)."""
        records = audit_export(f"sqlite://{self.audit_db}")
        return [r["data"] for r in records if r["type"].startswith("request.")]

    def audit_text(self) -> bytes:
        return self.audit_db.read_bytes() + b"".join(
            p.read_bytes() for p in self.audit_db.parent.glob("audit.db-*"))


def _build(serve_asgi: Callable[..., Any], tmp_path: Path, timeout_s: str = "2.0",
           eu_a: Any = None, pii: str | None = None,
           apps: dict[str, Any] | None = None, extra: dict[str, Any] | None = None) -> Stack:
    sims = {name: create_sim(SimConfig(models=["m"])) for name in ("eu-a", "eu-b", "us")}
    if eu_a is not None:
        sims["eu-a"] = eu_a
    sims.update(apps or {})
    servers = {name: serve_asgi(app) for name, app in sims.items()}
    (tmp_path / "policy.yaml").write_text(
        policy_text({n: s.port for n, s in servers.items()})
        + (pii or PII % (timeout_s, 0 if timeout_s != "2.0" else 16384)))
    cfg = gateway_config({n: s.url for n, s in servers.items()}, Path("policy.yaml"))
    signer = Signer.generate()
    key, _ = write_key_pair(signer, tmp_path / "audit.key")
    cfg["audit"] = {
        "store": f"sqlite://{tmp_path / 'audit.db'}",
        "signing_key_file": str(key),
        "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key")),
        "replica_id": "pii-test",
    }
    cfg.update(extra or {})
    settings = parse(cfg)
    runtime = start_egress(settings, tmp_path)
    app = create_app(settings, assemble(settings, tmp_path, egress=runtime))
    return Stack(serve_asgi(app).url, sims, tmp_path / "audit.db")


@pytest.fixture
def stack(serve_asgi: Callable[..., Any], tmp_path: Path) -> Stack:
    return _build(serve_asgi, tmp_path)


def _chat(client: openai.OpenAI, text: str, stream: bool = False) -> str:
    messages: Any = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
    if stream:
        chunks = client.chat.completions.create(model="m", messages=messages, max_tokens=4,
                                                stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    resp = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
    return resp.choices[0].message.content or ""


def test_a_public_keys_request_with_an_iban_only_goes_where_confidential_may(
        stack: Stack) -> None:
    client = stack.client("pub")
    for i in range(6):
        assert _chat(client, f"Please pay invoice {i} to {IBAN}.", stream=i % 2 == 1)
    assert stack.received() == {"eu-a": 6, "eu-b": 0, "us": 0}
    for _ in range(6):  # the same key without an identifier may go anywhere
        assert _chat(client, "Please summarise the meeting.")
    received = stack.received()
    assert received["us"] > 0 and received["eu-b"] > 0


def test_embeddings_and_completions_inputs_are_scanned_too(stack: Stack) -> None:
    client = stack.client("pub")
    client.embeddings.create(model="m", input=[f"account {IBAN}"])
    client.completions.create(model="m", prompt="Steuer-ID 86 095 742 719", max_tokens=2)
    assert stack.received() == {"eu-a": 2, "eu-b": 0, "us": 0}


def test_a_refused_entity_is_a_403_naming_its_type_never_its_value(stack: Stack) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        _chat(stack.client("pub"), f"my card is {CARD}, expiry 12/29")
    assert info.value.status_code == 403
    body = info.value.body
    assert isinstance(body, dict)
    assert body["code"] == "pii_refused" and body["param"] == "messages"
    assert "CREDIT_CARD" in body["message"]
    assert "4111" not in json.dumps(body)
    assert stack.received() == {"eu-a": 0, "eu-b": 0, "us": 0}


def test_masking_replaces_the_value_before_it_is_forwarded(stack: Stack) -> None:
    client = stack.client("research")  # team research: mask, class stays public
    resp = client.completions.create(model="m", prompt=f"Pay to {IBAN} today.", max_tokens=2,
                                     extra_body={"echo": True})
    text = resp.choices[0].text
    assert text.startswith("Pay to <IBAN_CODE> today.")
    assert "3704" not in text


def test_the_audit_log_records_types_counts_and_classes_never_the_text(stack: Stack) -> None:
    _chat(stack.client("pub"), f"IBAN {IBAN} and mail jane.doe@example.org")
    with pytest.raises(openai.PermissionDeniedError):
        _chat(stack.client("pub"), f"card {CARD}")
    _chat(stack.client("research"), f"IBAN {IBAN}")
    records = [r for r in stack.audit_requests() if r.get("pii") and "key_id" in r]
    by_key = [(r["key_id"], r["pii"]["entities"], r["pii"]["actions"],
               r["pii"]["class_before"], r["pii"]["class_after"]) for r in records]
    assert ("k-pub", {"IBAN_CODE": 1, "EMAIL_ADDRESS": 1},
            {"IBAN_CODE": "raise", "EMAIL_ADDRESS": "raise"}, "public", "confidential") in by_key
    assert ("k-pub", {"CREDIT_CARD": 1}, {"CREDIT_CARD": "refuse"}, "public",
            "public") in by_key
    assert ("k-research", {"IBAN_CODE": 1}, {"IBAN_CODE": "mask"}, "public",
            "public") in by_key
    raw = stack.audit_text()
    # Pieces long enough that a timestamp or a digest cannot hold them by chance (a bare
    # b"3704" was found in a record's ts_us once).
    for secret in (b"DE89", b"3704 0044", b"0532 0130", b"jane.doe", b"4111 1111"):
        assert secret not in raw


def test_a_scan_that_times_out_is_refused_where_a_refuse_rule_could_apply(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    """confidential fails closed; public is not in ``fail_closed_classes``, but the
    ``no-cards`` rule refuses cards for every key, and an unscanned request may hold one
    (tests/gateway/test_pii_failsafe.py: raised where only ``raise`` applies)."""
    stack = _build(serve_asgi, tmp_path, timeout_s="0.000001")
    for who in ("conf", "pub"):
        with pytest.raises(openai.InternalServerError) as info:
            _chat(stack.client(who), "hello there")
        assert info.value.status_code == 503
        assert isinstance(info.value.body, dict)
        assert info.value.body["code"] == "pii_scan_failed"
        assert "CREDIT_CARD" in info.value.body["message"] or who == "conf"
    assert stack.received() == {"eu-a": 0, "eu-b": 0, "us": 0}
    records = [r["pii"] for r in stack.audit_requests() if r.get("pii")]
    assert {r["class_before"] for r in records if r["error"] == "pii_scan_failed"} == {
        "public", "confidential"}


SPLIT = ["Your IBAN is DE89 37", "04 0044 0532", " 0130 00 and", " all is well."]


def _answering_an_iban() -> Starlette:
    """A backend whose answer holds an IBAN split across SSE events (and whole in JSON)."""

    async def chat(request: Request) -> Any:
        body = await request.json()
        if not body.get("stream"):
            return JSONResponse({
                "id": "c", "object": "chat.completion", "created": 0, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "".join(SPLIT)}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})

        async def events() -> Any:
            for piece in SPLIT:
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0,
                         "model": "m", "choices": [{"index": 0, "delta": {"content": piece},
                                                    "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    app.state.received = 0
    return app


@pytest.mark.parametrize("stream", [True, False])
def test_an_iban_split_across_response_events_is_recorded(
        serve_asgi: Callable[..., Any], tmp_path: Path, stream: bool) -> None:
    stack = _build(serve_asgi, tmp_path, eu_a=_answering_an_iban())
    answer = _chat(stack.client("conf"), "what is my IBAN?", stream=stream)
    assert answer == "".join(SPLIT)  # record mode: the client gets the answer unchanged
    records = [r["pii"] for r in stack.audit_requests()
               if r.get("pii") and "response_entities" in r["pii"]]
    assert [r["response_entities"] for r in records] == [{"IBAN_CODE": 1}]
    assert b"3704" not in stack.audit_text() and b"0532" not in stack.audit_text()


@contextlib.contextmanager
def _gateway_serve(tmp_path: Path, sims: dict[str, Any], servers: dict[str, Any],
                   pii: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``gateway serve`` in a subprocess, guard enforcing, with the test policy + ``pii``."""
    (tmp_path / "policy.yaml").write_text(
        policy_text({n: s.port for n, s in servers.items()}) + pii)
    port = free_port()
    cfg = gateway_config({n: s.url for n, s in servers.items()}, tmp_path / "policy.yaml",
                         guard="enforce", port=port)
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    url = f"http://127.0.0.1:{port}"
    with subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config",
                           str(cfg_file)], cwd=ROOT, env=env, stderr=subprocess.PIPE) as proc:
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    httpx.get(url + "/healthz", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    assert proc.poll() is None, "gateway exited"
                    assert time.monotonic() < deadline, "gateway did not start"
                    time.sleep(0.1)
            yield url, proc
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
            assert b"EgressBlocked" not in stderr, stderr[-3000:]


def _sims(serve_asgi: Callable[..., Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    sims = {name: create_sim(SimConfig(models=["m"])) for name in ("eu-a", "eu-b", "us")}
    return sims, {name: serve_asgi(app) for name, app in sims.items()}


def test_gateway_serve_with_the_guard_enforcing_raises_the_class(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    # The real entry point: `gateway serve` in a subprocess, process egress guard enforcing
    # (the detector is built after the guard started: Presidio's imports must not connect).
    sims, servers = _sims(serve_asgi)
    with _gateway_serve(tmp_path, sims, servers, PII % ("2.0", 16384)) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEYS["pub"], max_retries=0,
                               timeout=30)
        for i in range(4):
            assert _chat(client, f"Pay to {IBAN}.", stream=i % 2 == 0)
        with pytest.raises(openai.PermissionDeniedError):
            _chat(client, f"card {CARD}")
    assert {n: a.state.received for n, a in sims.items()} == {"eu-a": 4, "eu-b": 0, "us": 0}


def test_a_reloaded_pii_section_applies_to_new_requests(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    sims, servers = _sims(serve_asgi)
    lenient = PII.replace("    - {id: no-cards, entities: [CREDIT_CARD], action: refuse}\n", "")
    with _gateway_serve(tmp_path, sims, servers, lenient % ("2.0", 16384)) as (url, proc):
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEYS["pub"], max_retries=0,
                               timeout=30)
        assert _chat(client, f"card {CARD}")  # raised to confidential, not refused
        (tmp_path / "policy.yaml").write_text(
            policy_text({n: s.port for n, s in servers.items()}) + PII % ("2.0", 16384))
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while True:  # until the reload is applied: the next card is refused
            try:
                _chat(client, f"card {CARD}")
            except openai.PermissionDeniedError as exc:
                assert isinstance(exc.body, dict) and exc.body["code"] == "pii_refused"
                break
            assert time.monotonic() < deadline, "the reloaded pii section was not applied"
            time.sleep(0.2)
        assert _chat(client, f"Pay to {IBAN}.")  # the detector still raises after the swap
    received = {n: a.state.received for n, a in sims.items()}
    assert received["eu-b"] == 0 and received["us"] == 0
