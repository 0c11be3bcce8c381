"""Sensitive data in every field a request carries upstream, end to end.

The stack of ``test_pii_gateway`` (real uvicorn on loopback, the official openai SDK, three
vLLM simulators as replicas ``us``, ``eu-b``, ``eu-a``; only ``eu-a`` may receive
``confidential``), each replica behind a recorder of the bytes it receives. An IBAN (which the
policy raises to ``confidential``, and masks for team ``research``) or a card (refused) is put
in one field family at a time: tool descriptions and JSON-schema parameters, legacy
``functions``, ``response_format``, ``metadata``, ``user``, ``prediction``, ``stop``, vLLM's
``guided_json`` and ``structured_outputs``, a message part's ``data:`` URL, embeddings'
``user``, the Responses API's ``tools`` and ``text.format``, and a batch's JSONL line. The
simulator has no Responses API: the recorder answers ``/v1/responses`` itself.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.gateway.helpers import take_request_body
from tests.gateway.test_batch_api import submit, wait_batch
from tests.gateway.test_pii_gateway import CARD, IBAN, Stack, _build
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

DIGITS = ("3704", "0532", "370400440532013000")
SCHEMA = {"type": "object", "properties": {"account": {"type": "string"}}}


class Recorder:
    """An ASGI app in front of a replica that keeps every request body it is sent."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state = app.state
        self.bodies: list[tuple[str, bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":  # lifespan, model listing
            await self.app(scope, receive, send)
            return
        raw, replay = await take_request_body(receive)
        self.bodies.append((scope["path"], raw))
        if scope["path"] == "/v1/responses":  # not in the simulator
            self.state.received += 1
            body = json.dumps({"id": "resp_1", "object": "response", "created_at": 0,
                               "model": "m", "status": "completed", "output": [],
                               "parallel_tool_calls": True, "tool_choice": "auto",
                               "tools": []}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, replay, send)


class Recorded:
    def __init__(self, stack: Stack, recorders: dict[str, Recorder]) -> None:
        self.stack, self.recorders = stack, recorders

    def reset(self) -> None:
        """Forget what the replicas received (bodies and the simulators' counters)."""
        for recorder in self.recorders.values():
            recorder.bodies.clear()
            recorder.state.reset()

    def bodies(self) -> list[bytes]:
        return [raw for r in self.recorders.values() for _, raw in r.bodies]

    def unmasked(self) -> list[str]:
        """Bodies received that still hold a digit run of the IBAN (or of the card)."""
        out = []
        for raw in self.bodies():
            text = json.dumps(json.loads(raw))  # \\u escapes written as the client chose
            text = json.loads(json.dumps(text))
            if any(d in text for d in (*DIGITS, "4111")):
                out.append(text[:200])
        return out


@pytest.fixture(scope="module")
def _stack(serve_asgi_module: Callable[..., Any],
           tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """One gateway and its three recorded replicas for the whole module.

    Shared because no test changes it: the tests send requests and read what the replicas
    received, and ``recorded`` empties that before each test. Nothing else carries over that
    a test asserts: no quotas, an IBAN request may go to ``eu-a`` only whatever the replica
    rotation is at, and each batch test waits for its own batch to end.
    """
    tmp_path = tmp_path_factory.mktemp("pii-fields")
    recorders = {n: Recorder(create_sim(SimConfig(models=["m"]))) for n in ("eu-a", "eu-b", "us")}
    batch = {"flow_control": {"enabled": True, "default_class": "interactive",
                              "classes": [{"name": "interactive"}, {"name": "batch"}]},
             "batch": {"database": str(tmp_path / "batch.db"), "concurrency": 1}}
    return Recorded(_build(serve_asgi_module, tmp_path, apps=dict(recorders), extra=batch),
                    recorders)


@pytest.fixture
def recorded(_stack: Recorded) -> Recorded:
    """The module's stack, what its replicas received so far forgotten."""
    _stack.reset()
    return _stack


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    messages = kwargs.pop("messages", [{"role": "user", "content": "Please help."}])
    return client.chat.completions.create(model="m", messages=messages, max_tokens=2, **kwargs)


def _run_batch(client: openai.OpenAI, lines: list[dict[str, Any]]) -> Any:
    """Upload ``lines`` as a batch input file, create the batch, wait until it ended."""
    b = submit(client, "".join(json.dumps(line) + "\n" for line in lines).encode())
    return wait_batch(client, b.id, lambda b: b.status in ("completed", "failed", "cancelled"),
                      timeout_s=60)


def _tools(secret: str) -> list[Any]:
    return [{"type": "function", "function": {
        "name": "pay", "description": f"Pays to the account {secret} by default.",
        "parameters": {"type": "object", "properties": {"account": {
            "type": "string", "description": f"for example {secret}",
            "default": secret, "examples": [secret]}}}}}]


#: One request per field family, each carrying ``secret`` only in that family.
FAMILIES: dict[str, Callable[[openai.OpenAI, str], Any]] = {
    "tools": lambda c, s: _chat(c, tools=_tools(s)),
    "functions (legacy)": lambda c, s: _chat(c, functions=[
        {"name": "pay", "description": f"to {s}", "parameters": SCHEMA}], function_call="auto"),
    "response_format": lambda c, s: _chat(c, response_format={
        "type": "json_schema", "json_schema": {"name": "out", "description": f"about {s}",
                                               "schema": {**SCHEMA, "examples": [s]}}}),
    "a property named like a keyword": lambda c, s: _chat(c, response_format={
        "type": "json_schema", "json_schema": {"name": "out", "schema": {
            "type": "object", "properties": {"enum": {"type": "string",
                                                      "description": f"like {s}"}}}}}),
    "metadata": lambda c, s: _chat(c, metadata={"note": f"customer {s}"}, store=False),
    "user": lambda c, s: _chat(c, user=f"holder {s}"),
    "prediction": lambda c, s: _chat(c, prediction={"type": "content", "content": f"It is {s}"}),
    "stop": lambda c, s: _chat(c, stop=[f"stop at {s}"]),
    "guided_json": lambda c, s: _chat(c, extra_body={"guided_json": {
        "type": "object", "description": f"account {s}", "properties": {}}}),
    "structured_outputs": lambda c, s: _chat(c, extra_body={"structured_outputs": {
        "json": {"type": "object", "title": f"for {s}"}}}),
    "vllm extras": lambda c, s: _chat(c, extra_body={"vllm_xargs": {"note": f"acct {s}"}}),
    "content parts": lambda c, s: _chat(c, messages=[
        {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "name": "jane", "content": [
            {"type": "text", "text": "see the note"},
            {"type": "image_url", "image_url": {"url": f"data:text/plain,note {s}"}}]}]),
    "completions": lambda c, s: c.completions.create(model="m", prompt="hello", max_tokens=2,
                                                     user=f"holder {s}"),
    "embeddings": lambda c, s: c.embeddings.create(model="m", input="hello",
                                                   user=f"holder {s}"),
    "responses tools": lambda c, s: c.responses.create(model="m", input="pay", tools=[
        {"type": "function", "name": "pay", "description": f"to {s}", "strict": False,
         "parameters": {**SCHEMA, "description": f"e.g. {s}"}}]),
    "responses text.format": lambda c, s: c.responses.create(model="m", input="hi", text={
        "format": {"type": "json_schema", "name": "out",
                   "schema": {**SCHEMA, "description": f"about {s}"}}}),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_iban_in_any_field_raises_the_class(recorded: Recorded, family: str) -> None:
    client = recorded.stack.client("pub")  # public key: an IBAN raises it to confidential
    for _ in range(3):  # public traffic would be spread over all three replicas
        FAMILIES[family](client, IBAN)
    assert recorded.stack.received() == {"eu-a": 3, "eu-b": 0, "us": 0}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_iban_in_any_field_is_masked_before_the_replica_sees_it(
        recorded: Recorded, family: str) -> None:
    FAMILIES[family](recorded.stack.client("research"), IBAN)  # team research: mask
    bodies = recorded.bodies()
    assert len(bodies) == 1
    assert b"<IBAN_CODE>" in bodies[0]
    assert recorded.unmasked() == []


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_card_in_any_field_is_refused_and_nothing_is_sent(
        recorded: Recorded, family: str) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        FAMILIES[family](recorded.stack.client("pub"), CARD)
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "pii_refused"
    assert "4111" not in json.dumps(info.value.body)
    assert recorded.bodies() == []


#: Where a mask would corrupt the request: refused instead of masked.
STRUCTURAL: dict[str, Callable[[openai.OpenAI, str], Any]] = {
    "function name": lambda c, s: _chat(c, tools=[{"type": "function", "function": {
        "name": s.replace(" ", ""), "parameters": SCHEMA}}]),
    "tool_choice name": lambda c, s: _chat(c, tools=[
        {"type": "function", "function": {"name": "pay", "parameters": SCHEMA}},
        {"type": "function", "function": {"name": s.replace(" ", ""), "parameters": SCHEMA}}],
        tool_choice={"type": "function", "function": {"name": s.replace(" ", "")}}),
    "schema enum": lambda c, s: _chat(c, tools=[{"type": "function", "function": {
        "name": "pay", "parameters": {"type": "object", "properties": {
            "account": {"type": "string", "enum": [s, "other"]}}}}}]),
    "guided_choice": lambda c, s: _chat(c, extra_body={"guided_choice": [s, "no"]}),
    "logit_bias key": lambda c, s: _chat(c, logit_bias={s: 1}),
    "property name": lambda c, s: _chat(c, response_format={
        "type": "json_schema", "json_schema": {"name": "o", "schema": {
            "type": "object", "properties": {s: {"type": "string"}}}}}),
    "base64 text data: URL": lambda c, s: _chat(c, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _b64(s)}}]}]),
    "file_data": lambda c, s: _chat(c, messages=[{"role": "user", "content": [
        {"type": "file", "file": {"file_data": "data:text/plain;base64," + _b64(s)}}]}]),
    "input_audio base64": lambda c, s: _chat(c, messages=[{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": _b64(f"say {s}"), "format": "wav"}}]}]),
}


@pytest.mark.parametrize("family", list(STRUCTURAL))
def test_where_a_mask_would_corrupt_the_request_it_is_refused(
        recorded: Recorded, family: str) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        STRUCTURAL[family](recorded.stack.client("research"), IBAN)
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "pii_refused"
    assert "cannot be masked" in info.value.body["message"]
    assert recorded.bodies() == []
    STRUCTURAL[family](recorded.stack.client("pub"), IBAN)  # raise: allowed, to eu-a only
    assert recorded.stack.received() == {"eu-a": 1, "eu-b": 0, "us": 0}


def test_a_card_sent_as_a_json_number_is_refused(recorded: Recorded) -> None:
    with pytest.raises(openai.PermissionDeniedError):
        _chat(recorded.stack.client("pub"), extra_body={"vllm_xargs": {"ref": 4111111111111111}})
    assert recorded.bodies() == []


def test_a_duplicated_key_is_refused_since_the_replica_would_read_unscanned_bytes(
        recorded: Recorded) -> None:
    import httpx

    from tests.gateway.egress_testdata import KEYS
    raw = ('{"model": "m", "max_tokens": 2, "messages": [{"role": "user", '
           f'"content": "pay to {IBAN}", "content": "hello"}}]}}')
    resp = httpx.post(recorded.stack.url + "/v1/chat/completions", content=raw,
                      headers={"authorization": f"Bearer {KEYS['research']}",
                               "content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "duplicate_key"
    assert "3704" not in resp.text
    assert recorded.bodies() == []


def test_every_line_of_a_batch_is_scanned_like_a_request(recorded: Recorded) -> None:
    client = recorded.stack.client("research")
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "max_tokens": 2, "tools": _tools(IBAN),
                       "messages": [{"role": "user", "content": "hello"}]}} for i in range(2)]
    lines.append({"custom_id": "card", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": "m", "max_tokens": 2, "metadata": {"c": CARD},
                           "messages": [{"role": "user", "content": "hello"}]}})
    b = _run_batch(client, lines)
    assert b.status == "completed", b
    assert b.request_counts is not None and b.request_counts.completed == 2
    assert len(recorded.bodies()) == 2
    assert all(b"<IBAN_CODE>" in raw for raw in recorded.bodies())
    assert recorded.unmasked() == []


def _spaced(ident: str, sep: str) -> str:
    return sep.join(ident[i:i + 4] for i in range(0, len(ident), 4))


#: How a pasted card or IBAN may be written (tester2 F1): Unicode spaces, other digit sets,
#: invisible characters.
LOOKALIKES: dict[str, Callable[[str], str]] = {
    "no-break space": lambda s: _spaced(s, "\u00a0"),
    "narrow no-break space": lambda s: _spaced(s, "\u202f"),
    "thin space": lambda s: _spaced(s, "\u2009"),
    "tab": lambda s: _spaced(s, "\t"),
    "fullwidth digits": lambda s: _spaced(s, " ").translate(
        {ord(d): 0xFF10 + int(d) for d in "0123456789"}),
    "arabic-indic digits": lambda s: s.translate({ord(d): 0x660 + int(d) for d in "0123456789"}),
    "zero-width space": lambda s: _spaced(s, "\u200b"),
    "soft hyphen": lambda s: _spaced(s, "\u00ad"),
}


@pytest.mark.parametrize("form", list(LOOKALIKES))
def test_a_card_written_with_lookalikes_is_refused_and_nothing_is_sent(
        recorded: Recorded, form: str) -> None:
    card = LOOKALIKES[form](CARD.replace(" ", ""))
    with pytest.raises(openai.PermissionDeniedError) as info:
        _chat(recorded.stack.client("pub"), messages=[
            {"role": "user", "content": f"my card {card}"}])
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "pii_refused"
    assert recorded.bodies() == []


@pytest.mark.parametrize("form", list(LOOKALIKES))
def test_an_iban_written_with_lookalikes_is_masked_as_written(
        recorded: Recorded, form: str) -> None:
    iban = LOOKALIKES[form](IBAN.replace(" ", ""))
    _chat(recorded.stack.client("research"), messages=[
        {"role": "user", "content": f"pay to {iban} today"}])
    [raw] = recorded.bodies()
    [message] = json.loads(raw)["messages"]
    assert message["content"] == "pay to <IBAN_CODE> today"


@pytest.mark.parametrize("literal", ["4111111111111111.0", "4.111111111111111e15"])
def test_a_card_sent_as_a_json_float_is_refused(recorded: Recorded, literal: str) -> None:
    import httpx

    from tests.gateway.egress_testdata import KEYS
    raw = ('{"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], '
           f'"vllm_xargs": {{"ref": {literal}}}}}')
    resp = httpx.post(recorded.stack.url + "/v1/chat/completions", content=raw,
                      headers={"authorization": f"Bearer {KEYS['pub']}",
                               "content-type": "application/json"})
    assert resp.status_code == 403 and resp.json()["error"]["code"] == "pii_refused"
    assert recorded.bodies() == []


def test_a_batch_line_with_a_card_grouped_by_no_break_spaces_is_refused(
        recorded: Recorded) -> None:
    client = recorded.stack.client("pub")
    card = _spaced(CARD.replace(" ", ""), "\u00a0")
    lines = [{"custom_id": "ok", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "max_tokens": 2,
                       "messages": [{"role": "user", "content": "hello"}]}},
             {"custom_id": "card", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "max_tokens": 2,
                       "messages": [{"role": "user", "content": f"card {card}"}]}}]
    b = _run_batch(client, lines)
    assert b.request_counts is not None and b.request_counts.completed == 1, b
    assert len(recorded.bodies()) == 1
    assert recorded.unmasked() == []
