"""An attacker's try of the MCP endpoint (round 4): each test is one way past a promise of
``docs/mcp.md``, against a real ``gateway serve`` on loopback in front of a hostile raw
upstream (:func:`tests.gateway.mcp_gateway.upstreams.status_server`) or the official SDK's
``MCPServer``, the audit chain read back with ``gateway audit export``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.mcp.records import name_digest
from tests.gateway.mcp_gateway.harness import Gateway, start_gateway
from tests.gateway.mcp_gateway.test_mcp_bad_input import META, call, headers, post
from tests.gateway.mcp_gateway.test_mcp_hostile_round3 import CARD, PII
from tests.gateway.mcp_gateway.upstreams import status_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

ACCESS = [{"teams": ["agents"], "allow": ["*"],
           "resources": {"allow": ["docs://public/*"]}}]
LEAKS = ("SECRET", "etc/passwd", "private/plan", "upstream=1", "realm")


def _hostile(serve_asgi: Callable[..., Any], tmp_path: Path,
             policy_extra: str = "") -> Iterator[dict[str, Any]]:
    received: list[dict[str, Any]] = []
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    evil = serve_asgi(status_server(received))

    def extra(mcp: dict[str, Any]) -> None:
        mcp["access"] = ACCESS
        mcp["aggregate"] = True

    gw = start_gateway(tmp_path, sim.url, {"evil": evil.url + "/mcp"}, {}, extra,
                       policy_extra=policy_extra)
    try:
        yield {"gateway": gw, "received": received}
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def shared_hostile(serve_asgi_module: Callable[..., Any],
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The gateway (aggregate endpoint on) in front of :func:`status_server` as ``evil``;
    ``received``: every message the upstream got. Shared by the module's tests through
    :func:`hostile` (the gateway keeps no state they assert: no quotas, no sessions)."""
    yield from _hostile(serve_asgi_module, tmp_path_factory.mktemp("hostile"))


@pytest.fixture
def hostile(shared_hostile: dict[str, Any]) -> dict[str, Any]:
    """:func:`shared_hostile` as one test sees it: the records from the start of the test."""
    return {**shared_hostile, "gateway": shared_hostile["gateway"].from_now()}


@pytest.fixture
def own_hostile(serve_asgi: Callable[..., Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """:func:`shared_hostile` for one test that stops its gateway."""
    yield from _hostile(serve_asgi, tmp_path)


@pytest.fixture
def hostile_pii(serve_asgi: Callable[..., Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """:func:`hostile` with round 3's ``pii`` section (card numbers refused)."""
    yield from _hostile(serve_asgi, tmp_path, PII)


def _records(gw: Gateway, kind: str | None = None) -> list[dict[str, Any]]:
    """The MCP records of answers and refusals (``kind``: of that type only); a forwarded
    message's first record, ``mcp.started``, and the gateway's own catalogue fetches,
    ``mcp.catalogue``, only when asked for (their own tests: test_mcp_record_before_forward.py,
    test_mcp_catalogue_records.py)."""
    return [r["data"] | {"type": r["type"]} for r in gw.records()
            if r["type"].startswith("mcp.") and (
                r["type"] == kind if kind is not None
                else r["type"] not in ("mcp.started", "mcp.catalogue"))]


def _clean(text: str) -> None:
    for leak in LEAKS:
        assert leak not in text, (leak, text[:400])


def test_an_answer_with_any_http_status_is_checked_like_a_200(hostile: dict[str, Any]) -> None:
    """Whatever the upstream's status, its answer to a request is id-checked, sifted and
    hashed: a JSON-RPC response with the request's id is relayed with the denied resources
    withheld (2xx as 200, a client error's status kept, a server error as 502); a body that
    is not the request's response (another id, an HTML page) becomes the gateway's own
    JSON-RPC error; the upstream's headers never reach the client. The aggregate endpoint
    and filtered lists take the same path."""
    gw: Gateway = hostile["gateway"]
    expected = {201: 200, 203: 200, 299: 200, 400: 400, 404: 404, 429: 429, 500: 502,
                503: 502, 401: 502, 403: 502}
    rid = 0
    for upstream_status, status in expected.items():
        for body in ("result", "error"):
            rid += 1
            resp = post(gw.mcp("evil"), call("answer", {"status": upstream_status,
                                                        "body": body}, rid),
                        headers(name="answer"))
            assert resp.status_code == status, (upstream_status, body, resp.text)
            _clean(resp.text + json.dumps(dict(resp.headers)))
            assert resp.json()["id"] == rid
            assert "withheld by the gateway" in resp.text
        for bad in ({"id": "someone-else"}, {"body": "html"}):
            rid += 1
            resp = post(gw.mcp("evil"), call("answer", {"status": upstream_status, **bad},
                                             rid), headers(name="answer"))
            _clean(resp.text + json.dumps(dict(resp.headers)))
            assert resp.status_code == (status if status != 200 else 502), (bad, resp.text)
            assert resp.json() == {"jsonrpc": "2.0", "id": rid, "error": {
                "code": -32002, "message": resp.json()["error"]["message"]}}
    calls = _records(gw, "mcp.tool_call")
    assert len(calls) == rid
    assert all(c["result_sha256"] for c in calls), calls
    relayed = [c for c in calls if c["reason"] is None]
    assert len(relayed) == 2 * len(expected)
    assert all(c["withheld"]["count"] == 2 for c in relayed), relayed
    assert {c["reason"] for c in calls if c["reason"]} == {"upstream_status"}

    for cursor in ("203", "404"):
        listing = {"jsonrpc": "2.0", "id": 9, "method": "resources/list",
                   "params": {"cursor": cursor, "_meta": META}}
        resp = post(gw.mcp("evil"), listing, headers(method="resources/list"))
        _clean(resp.text)
        assert [r["uri"] for r in resp.json()["result"]["resources"]] == ["docs://public/ok"]

    resp = post(gw.url + "/mcp", call("evil__answer", {"status": 203}, 77),
                headers(name="evil__answer"))
    assert resp.status_code == 200 and "withheld by the gateway" in resp.text
    _clean(resp.text)


def test_an_answer_to_a_notification_or_client_response_is_never_relayed(
        hostile: dict[str, Any]) -> None:
    """The transport expects ``202`` with no body for a notification or a client response:
    an upstream body is never relayed (accepted: 202 and nothing; refused: the gateway's
    JSON-RPC error without an id), and the record holds the SHA-256 of what came back."""
    gw: Gateway = hostile["gateway"]
    old = {**headers(method="notifications/progress"), "mcp-protocol-version": "2025-06-18"}
    note: dict[str, Any] = {"jsonrpc": "2.0", "method": "notifications/progress",
                            "params": {"progressToken": 1, "progress": 1}}
    for status, expected in ((200, 202), (299, 202), (202, 202), (400, 400), (500, 502)):
        resp = post(gw.mcp("evil"), {**note, "params": {**note["params"], "status": status}},
                    old)
        assert resp.status_code == expected, (status, resp.text)
        _clean(resp.text + json.dumps(dict(resp.headers)))
        if expected == 202:
            assert resp.content == b""
        else:
            assert resp.json()["id"] is None and resp.json()["error"]["code"] == -32002
    answer = {"jsonrpc": "2.0", "id": 5, "result": {"status": 200}}
    old.pop("mcp-method")
    resp = post(gw.mcp("evil"), answer, old)
    assert resp.status_code == 202 and resp.content == b"", resp.text
    records = [r for r in _records(gw) if r["mcp_method"] in ("notifications/progress", None)]
    assert len(records) == 6 and all(r["result_sha256"] for r in records), records


VICTIM_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_refusals_of_unknown_callers_are_counted_and_hold_no_client_text(
        own_hostile: dict[str, Any]) -> None:
    """Anyone can send a request without a key: its refusal is counted per client and
    reason (one record, then one with the interval's count), never one record per request;
    the path's text (an unknown server name with a card number) is not recorded as given,
    and a ``traceparent`` someone sent along joins no trace."""
    gw: Gateway = own_hostile["gateway"]
    payload = "IGNORE-PREVIOUS;card=4111111111111111;" + "A" * 7000
    trace = {"traceparent": f"00-{VICTIM_TRACE}-00f067aa0ba902b7-01"}
    with httpx.Client(timeout=10) as client:
        assert client.post(gw.mcp(payload), content=b"{}").status_code == 404
        for i in range(40):
            assert client.post(gw.mcp(f"nosuch{i}"), content=b"{}").status_code == 404
            assert client.post(gw.mcp("evil"), content=b"{}", headers=trace).status_code == 401
            resp = client.post(gw.mcp("evil"), content=b"{}",
                               headers={"authorization": f"Bearer bogus-{i}", **trace})
            assert resp.status_code == 401
    gw.stop()  # the counts of the interval are written at shutdown
    records = _records(gw, "mcp.refused")
    text = json.dumps(records)
    assert "4111" not in text and "AAAA" not in text and "nosuch" not in text
    assert VICTIM_TRACE not in text
    by_reason: dict[tuple[Any, Any], int] = {}
    for rec in records:
        assert rec["count"] >= 1 and rec["client"] and rec.get("trace_id") is None, rec
        key = (rec["server"], rec["reason"])
        by_reason[key] = by_reason.get(key, 0) + rec["count"]
    # A missing credential and an unknown key share one answer, not one reason.
    assert by_reason == {(None, "unknown_server"): 41, ("evil", "missing_credential"): 40,
                         ("evil", "unknown_key"): 40}, by_reason
    assert len(records) <= 2 * len(by_reason), records


def test_names_asked_for_are_recorded_as_digests_unless_known(hostile: dict[str, Any]) -> None:
    """A tool or prompt name is the caller's text: recorded as given only when it is known
    (a tool of the server's catalogue, a prompt the server answered), else as its SHA-256
    and length, however long it is and whatever it holds."""
    gw: Gateway = hostile["gateway"]
    old = {"mcp-protocol-version": "2025-06-18"}
    tool = "card-4111111111111111-" + "N" * 100_000
    prompt = "ok-4111111111111111-" + "P" * 100_000
    agg = "nosuch__" + "Q" * 100_000
    resp = post(gw.mcp("evil"), call("lookup", {}), headers(name="lookup"))
    assert resp.status_code == 200, resp.text
    bad = {"jsonrpc": "2.0", "id": 6, "method": "tools/call",
           "params": {"name": tool, "arguments": {}}}
    assert post(gw.mcp("evil"), bad, {**headers(), **old}).status_code == 400
    ask = {"jsonrpc": "2.0", "id": 7, "method": "prompts/get", "params": {"name": prompt}}
    assert post(gw.mcp("evil"), ask, {**headers(method="prompts/get"), **old}).status_code == 403
    bad["params"]["name"] = agg
    assert post(gw.url + "/mcp", bad, {**headers(), **old}).status_code == 400
    records = _records(gw)
    text = json.dumps(records)
    assert "4111" not in text and "NNNN" not in text and "QQQQ" not in text, len(text)
    assert len(text) < 10_000
    assert [r["tool"] for r in records if r["type"] == "mcp.tool_call"] == ["lookup"]
    unknown = [r["unknown_names"] for r in records if "unknown_names" in r]
    assert unknown == [{"tool": name_digest(tool)}, {"prompt": name_digest(prompt)},
                       {"tool": name_digest(agg)}], unknown
    assert name_digest(tool)["bytes"] == len(tool)


def test_a_single_valued_header_given_twice_is_refused(hostile: dict[str, Any]) -> None:
    """Which copy of a repeated single-valued header counts would depend on the reader: the
    MCP endpoint refuses each (the classification header as ``/v1`` does, same rule), and
    nothing is forwarded."""
    gw: Gateway = hostile["gateway"]
    received: list[dict[str, Any]] = hostile["received"]
    body = json.dumps(call("lookup", {}))
    twice = {"x-data-classification": ("secret", "internal"),
             "mcp-session-id": ("a", "b"),
             "traceparent": (f"00-{VICTIM_TRACE}-00f067aa0ba902b7-01",
                             "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"),
             "origin": ("http://a.example", "http://b.example"),
             "content-type": ("application/json", "text/plain")}
    before = len(received)
    for name, values in twice.items():
        hdrs = [(k, v) for k, v in headers(name="lookup").items() if k != name]
        hdrs += [(name, value) for value in values]
        for url in (gw.mcp("evil"), gw.url + "/mcp"):
            resp = httpx.post(url, content=body, headers=hdrs, timeout=10)
            assert resp.status_code == 400, (name, url, resp.text)
            assert resp.json()["error"]["code"] == -32600
            assert "given more than once" in resp.json()["error"]["message"], resp.text
    assert len(received) == before
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    resp = httpx.post(gw.url + "/v1/chat/completions", content=chat, timeout=10, headers=[
        ("authorization", "Bearer sg-mcp-agent"), ("content-type", "application/json"),
        ("x-data-classification", "secret"), ("x-data-classification", "internal")])
    assert resp.status_code == 400 and "given more than once" in resp.text
    refused = {r["reason"] for r in _records(gw, "mcp.refused")}
    assert refused == {"repeated_header"}, refused


def test_everything_a_call_forwards_is_scanned_and_bounded(hostile_pii: dict[str, Any]) -> None:
    """Not only ``params.arguments`` leaves: ``_meta`` (the progress token, custom keys) and
    any other ``params`` key are forwarded too, so the ``pii`` section scans them and the
    argument limit bounds them, at ``/mcp/<server>`` and at the aggregate ``/mcp``, for tool
    calls and for other messages; the record hashes them (``params_sha256``)."""
    gw: Gateway = hostile_pii["gateway"]
    received: list[dict[str, Any]] = hostile_pii["received"]
    old = {"mcp-protocol-version": "2025-06-18"}

    def with_params(name: str, **params: Any) -> dict[str, Any]:
        body = call(name, {})
        body["params"].update(params)
        return body

    clean = with_params("lookup", _meta={**META, "progressToken": "t-1"})
    assert post(gw.mcp("evil"), clean, headers(name="lookup")).status_code == 200
    cases = [
        (gw.mcp("evil"), "lookup", {"_meta": {**META, "progressToken": CARD}}, 403),
        (gw.mcp("evil"), "lookup", {"_meta": {**META, "com.example/chat": f"pay {CARD}"}}, 403),
        (gw.mcp("evil"), "lookup", {"context": f"card {CARD}"}, 403),
        (gw.mcp("evil"), "lookup", {"context": "x" * 300_000}, 413),
        (gw.url + "/mcp", "evil__lookup", {"_meta": {**META, "com.example/chat": CARD}}, 403),
    ]
    for url, name, params, status in cases:
        resp = post(url, with_params(name, **params), headers(name=name))
        assert resp.status_code == status, (params.keys(), resp.text)
    note = {"jsonrpc": "2.0", "method": "notifications/progress",
            "params": {"progressToken": 1, "progress": 1, "_meta": {"com.example/x": CARD}}}
    resp = post(gw.mcp("evil"), note, {**headers(method="notifications/progress"), **old})
    assert resp.status_code == 403, resp.text
    sent = json.dumps(received)
    assert CARD not in sent and CARD.replace(" ", "") not in sent
    assert [r["params"]["name"] for r in received if r.get("method") == "tools/call"] == [
        "lookup"]
    records = _records(gw)
    assert [r["reason"] for r in records] == [
        None, "pii_refused", "pii_refused", "pii_refused", "params_too_large", "pii_refused",
        "pii_refused"], records
    assert records[0]["params_sha256"] and records[0]["pii"]["entities"] == {}
