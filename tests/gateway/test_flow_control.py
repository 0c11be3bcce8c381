"""Flow control through the real gateway (uvicorn on loopback, vLLM simulator, openai SDK).

Saturation is made deterministic with the ``in_flight`` threshold of 1 and a request of the
lowest class (``batch``: a class's threshold counts its own requests and those of the classes
below it, so this one counts against every class) that the simulator holds (fault ``hang``):
while it is held every new request queues; closing its
connection frees the replica, and queued requests are then dispatched one at a time, in the
order the simulator's request history shows (matched by ``x-request-id``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.assembly import Gateway, assemble
from gateway.audit import Signer, generate_key_file, open_store, write_key_pair
from gateway.audit.records import Record
from gateway.config.loader import parse
from gateway.config.settings import GatewaySettings
from gateway.flow.gate import FlowGate
from gateway.telemetry import Telemetry
from gateway.telemetry.settings import TelemetrySettings
from tests.gateway.helpers import SERVED, Recorder, Sim, sha, start_sim
from vllm_sim.profiles import PROFILES

KEYS = {
    "interactive": "sg-flow-interactive-key",
    "std": "sg-flow-standard-key",
    "batch-1": "sg-flow-batch-one-key",
    "batch-2": "sg-flow-batch-two-key",
    "holder": "sg-flow-holder-key",
}


def flow_settings(sim_url: str, *, models: list[dict[str, Any]] | None = None,
                  **flow: Any) -> GatewaySettings:
    section: dict[str, Any] = {
        "enabled": True,
        "classes": [
            {"name": "interactive", "max_queue": 10, "max_wait_s": 20},
            {"name": "standard", "max_queue": 10, "max_wait_s": 20},
            {"name": "batch", "max_queue": 20, "max_wait_s": 20},
        ],
        "default_class": "standard",
        "saturation": {"in_flight": 1},
        "keys": {"interactive": {"class": "interactive"},
                 "batch-1": {"class": "batch", "weight": 1},
                 "batch-2": {"class": "batch", "weight": 2},
                 "holder": {"class": "batch"}},
    }
    extra = flow.pop("_extra", None)
    section.update(flow)
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": models or [{"name": "m", "served_model_name": SERVED,
                              "replicas": [{"url": sim_url}]}],
        "keys": [{"id": k, "sha256": sha(v), "models": ["*"]} for k, v in KEYS.items()],
        "timeouts": {"connect_s": 2, "first_byte_s": 30, "idle_s": 30},
        "health": {"active": False},
        "logging": {"access_log": False},
        "flow_control": section,
    }
    if extra:
        cfg.update(extra)
    return parse(cfg, {})


class Rig:
    """A simulator and a flow-controlled gateway, with a holder to saturate the replica."""

    def __init__(self, serve_asgi: Callable[..., Any], sim: Sim, s: GatewaySettings,
                 gateway: Gateway | None = None) -> None:
        self.sim = sim
        self.settings = s
        self.recorder = Recorder()
        self.gateway = gateway or Gateway.of(s, observers=[self.recorder])
        assert self.gateway.flow is not None
        self.gate: FlowGate = self.gateway.flow
        self.url = str(serve_asgi(create_app(s, self.gateway)).url)
        self.pool = self.gateway.router.pools[s.models[0].name]
        self.pool_threads = ThreadPoolExecutor(max_workers=16)
        self.holders: list[socket.socket] = []

    def client(self, who: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEYS[who], max_retries=0,
                             timeout=30)

    def raw_request(self, who: str, model: str = "m", extra: bytes = b"") -> socket.socket:
        """Send a streamed chat request on a raw socket (closing it is a client disconnect)."""
        body = json.dumps({"model": model, "stream": True, "max_tokens": 4,
                           "messages": [{"role": "user", "content": "hold"}]}).encode()
        port = int(self.url.rsplit(":", 1)[1])
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\n"
                     + f"authorization: Bearer {KEYS[who]}\r\n".encode() + extra
                     + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        return sock

    def hold(self) -> None:
        """Saturate the replica: one request of the lowest class that the simulator never
        answers."""
        self.sim.fault(mode="hang", count=1)
        self.holders.append(self.raw_request("holder"))
        wait_for(lambda: self.sim.stats()["received"] >= 1, "the held request reaches the sim")

    def release(self) -> None:
        """Close the held request's connection (the gateway cancels it upstream)."""
        self.holders.pop().close()

    def queued(self) -> dict[str, int]:
        return {cls: n for _, cls, n in self.gate.queue_lengths()}

    def wait_queued(self, n: int) -> None:
        wait_for(lambda: sum(self.queued().values()) == n, f"{n} requests queued")

    def submit(self, who: str, **kw: Any) -> Future[Any]:
        def call() -> Any:
            with self.client(who) as c:
                try:
                    return c.chat.completions.with_raw_response.create(
                        model="m", messages=[{"role": "user", "content": "hi"}],
                        **{"max_tokens": 4, **kw})
                except openai.APIStatusError as exc:
                    return exc

        return self.pool_threads.submit(call)

    def dispatch_order(self) -> list[str]:
        """The ``x-request-id`` of each chat request the simulator received, in order."""
        return [h["headers"].get("x-request-id", "") for h in self.sim.stats()["history"]
                if h["path"] == "/v1/chat/completions"]

    def close(self) -> None:
        for sock in self.holders:
            sock.close()
        self.pool_threads.shutdown(wait=True, cancel_futures=True)


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.01)


@pytest.fixture
def rigs(serve_asgi: Callable[..., Any]) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(**flow: Any) -> Rig:
        sim = start_sim(serve_asgi)  # first: the gateway config names its URL
        rig = Rig(serve_asgi, sim, flow_settings(sim.url, **flow))
        made.append(rig)
        return rig

    yield make
    for rig in made:
        rig.close()


def _request_id(result: Any) -> str:
    return str(result.headers["x-request-id"])


def test_queued_requests_are_dispatched_by_strict_priority(rigs: Callable[..., Rig]) -> None:
    rig = rigs()
    rig.hold()
    futures = []
    for who in ("batch-1", "batch-1", "std", "interactive", "interactive"):
        futures.append((who, rig.submit(who)))
        rig.wait_queued(len(futures))
    assert rig.queued() == {"interactive": 2, "standard": 1, "batch": 2}
    # The gate's hand-overs, in order (FlowGate.hold is called once per dispatched request).
    handed: list[str] = []
    hold = rig.gate.hold

    def counting_hold(replica: Any, cls: int) -> None:
        handed.append(rig.gate.classes[cls].name)
        hold(replica, cls)

    rig.gate.hold = counting_hold  # type: ignore[method-assign]
    rig.release()
    ids = {_request_id(f.result(timeout=30)): who for who, f in futures}
    assert handed == ["interactive", "interactive", "standard", "batch", "batch"]
    order = [ids[i] for i in rig.dispatch_order() if i in ids]
    # A class's in_flight threshold counts its own and the lower classes' requests: while the
    # standard request runs, batch has room of its own, so those two may reach the replica in
    # either order; the interactive ones run alone, first.
    assert order[:2] == ["interactive", "interactive"]
    assert sorted(order[2:]) == ["batch-1", "batch-1", "std"]
    records = {r.request_id: r for r in rig.recorder.wait(6)}
    for request_id in ids:
        flow = records[request_id].flow
        assert flow is not None and flow["outcome"] == "dispatched" and flow["wait_ms"] >= 0


def test_keys_of_a_class_share_it_by_weight(rigs: Callable[..., Rig]) -> None:
    rig = rigs(share_cost="requests")
    rig.hold()
    futures = []
    for who in ["batch-1"] * 3 + ["batch-2"] * 6:  # the light key queues first, the heavy after
        futures.append((who, rig.submit(who)))
        rig.wait_queued(len(futures))
    rig.release()
    ids = {_request_id(f.result(timeout=30)): who for who, f in futures}
    order = [ids[i][-1] for i in rig.dispatch_order() if i in ids]
    # Deficit round robin, weights 1 : 2.
    assert "".join(order) == "122122122"


def test_with_token_costs_a_key_sending_long_requests_gets_fewer_dispatches(
    rigs: Callable[..., Rig],
) -> None:
    """Equal weights; one key asks for 400 tokens per request, the other for 40: the short
    requests cost about 8.5 times less (the same 8-token prompt estimate each), so about 8.5
    of them are dispatched per long one, although the long ones queued first."""
    rig = rigs(keys={"batch-1": {"class": "batch"}, "batch-2": {"class": "batch"},
                     "holder": {"class": "batch"}})
    rig.hold()
    futures = []
    for who, max_tokens in [("batch-1", 400)] * 2 + [("batch-2", 40)] * 12:
        futures.append((who, rig.submit(who, max_tokens=max_tokens)))
        rig.wait_queued(len(futures))
    rig.release()
    ids = {_request_id(f.result(timeout=30)): who for who, f in futures}
    order = "".join(ids[i][-1] for i in rig.dispatch_order() if i in ids)
    costs = (8 + 400, 8 + 40)  # prompt estimate ("hi": 1 + 4 per message + 3) + max_tokens
    shorts_per_long = costs[0] / costs[1]
    assert abs(order.index("1") - shorts_per_long) <= 1, order
    assert order.count("1") == 2 and order.count("2") == 12
    # With request costs the long key's two requests would be two of the first four.
    assert "1" not in order[:4]


def test_a_full_queue_is_refused_with_its_own_code_and_retry_after(
    rigs: Callable[..., Rig],
) -> None:
    rig = rigs(classes=[{"name": "interactive", "max_queue": 5},
                        {"name": "standard", "max_queue": 5},
                        {"name": "batch", "max_queue": 2}])
    rig.hold()
    waiting = [rig.submit("batch-1"), rig.submit("batch-2")]
    rig.wait_queued(2)
    refused = rig.submit("batch-2").result(timeout=30)
    assert isinstance(refused, openai.RateLimitError)
    assert refused.code == "queue_full"
    assert refused.status_code == 429
    assert int(refused.response.headers["retry-after"]) >= 1
    # The other classes still queue: the bound is per class.
    other = rig.submit("interactive")
    rig.wait_queued(3)
    rig.release()
    assert all(f.result(timeout=30).http_response.status_code == 200
               for f in [*waiting, other])
    shed = [r for r in rig.recorder.wait(5) if r.error_code == "queue_full"]
    assert len(shed) == 1 and shed[0].flow == {"class": "batch", "outcome": "queue_full",
                                               "wait_ms": 0}
    assert shed[0].outcome == "denied" and shed[0].status == 429


def test_a_request_that_waits_too_long_gets_queue_timeout(rigs: Callable[..., Rig]) -> None:
    rig = rigs(classes=[{"name": "interactive", "max_wait_s": 0.4},
                        {"name": "standard"}, {"name": "batch"}])
    rig.hold()
    t0 = time.monotonic()
    refused = rig.submit("interactive").result(timeout=30)
    elapsed = time.monotonic() - t0
    assert isinstance(refused, openai.RateLimitError)
    assert refused.code == "queue_timeout"
    assert refused.response.headers["retry-after"].isdigit()
    assert 0.4 <= elapsed < 10
    assert sum(rig.queued().values()) == 0
    (record,) = rig.recorder.wait(1)
    assert record.flow is not None and record.flow["outcome"] == "queue_timeout"
    assert record.flow["wait_ms"] >= 400
    assert rig.sim.stats()["received"] == 1  # only the held request reached the backend


def test_a_client_that_disconnects_while_queued_leaves_the_queue_at_once(
    rigs: Callable[..., Rig],
) -> None:
    rig = rigs()
    rig.hold()
    queued = rig.raw_request("batch-1")
    rig.wait_queued(1)
    t0 = time.monotonic()
    queued.close()
    rig.wait_queued(0)
    assert time.monotonic() - t0 < 5
    (record,) = rig.recorder.wait(1)
    assert record.outcome == "client_disconnect"
    assert record.flow is not None and record.flow["outcome"] == "client_disconnect"
    rig.release()
    ok = rig.submit("batch-1").result(timeout=30)
    assert ok.http_response.status_code == 200
    assert rig.sim.stats()["received"] == 2  # the held one and the last; never the gone one
    assert rig.pool.replicas[0].outstanding == 0


def test_the_priority_header_may_lower_the_class_but_not_raise_it(
    rigs: Callable[..., Rig],
) -> None:
    rig = rigs()
    raised = rig.submit("batch-1", extra_headers={"x-priority": "interactive"}).result(30)
    assert isinstance(raised, openai.PermissionDeniedError)
    assert raised.code == "priority_raise_forbidden"
    assert raised.body is not None and raised.body["param"] == "x-priority"  # type: ignore[index]
    unknown = rig.submit("std", extra_headers={"x-priority": "urgent"}).result(30)
    assert isinstance(unknown, openai.BadRequestError)
    assert unknown.code == "unknown_priority_class"
    same = rig.submit("batch-1", extra_headers={"x-priority": "batch"}).result(30)
    assert same.http_response.status_code == 200
    assert rig.sim.stats()["received"] == 1  # the refused ones never reached the backend
    rig.hold()
    lowered = rig.submit("interactive", extra_headers={"x-priority": "batch"})
    rig.wait_queued(1)
    assert rig.queued()["batch"] == 1
    rig.release()
    assert lowered.result(timeout=30).http_response.status_code == 200


def test_the_priority_field_is_not_forwarded_unless_configured(
    serve_asgi: Callable[..., Any],
) -> None:
    # The replica runs vLLM's priority scheduling: it accepts any priority (fcfs refuses one).
    sim = start_sim(serve_asgi, scheduling_policy="priority")
    models = [{"name": "m", "served_model_name": SERVED, "replicas": [{"url": sim.url}]},
              {"name": "m-prio", "served_model_name": SERVED, "replicas": [{"url": sim.url}]}]
    s = flow_settings(sim.url, models=models, vllm_priority_models=["m-prio"],
                      saturation={"in_flight": 8})
    url = str(serve_asgi(create_app(s, assemble(s))).url)
    with openai.OpenAI(base_url=url + "/v1", api_key=KEYS["batch-1"], max_retries=0) as c:
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        assert "priority" not in sim.stats()["last_body"]
        # A client's own field is relayed as it was (the gateway adds and changes nothing).
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}],
                                  extra_body={"priority": 7})
        assert sim.stats()["last_body"]["priority"] == 7
        # A model served with vLLM priority scheduling gets the class's value (batch: 2),
        # replacing the client's.
        c.chat.completions.create(model="m-prio", messages=[{"role": "user", "content": "a"}],
                                  extra_body={"priority": -100})
        assert sim.stats()["last_body"]["priority"] == 2
    with openai.OpenAI(base_url=url + "/v1", api_key=KEYS["interactive"], max_retries=0) as c:
        stream = c.chat.completions.create(
            model="m-prio", messages=[{"role": "user", "content": "a"}], stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
        assert sim.stats()["last_body"]["priority"] == 0


@pytest.mark.parametrize(("model", "first"), [("m-prio", "interactive"), ("m", "batch-2")])
def test_a_priority_scheduling_replica_serves_the_higher_class_first_from_its_own_queue(
    serve_asgi: Callable[..., Any], tmp_path: Path, model: str, first: str,
) -> None:
    """End to end: the class's ``priority`` reaches the simulator's engine. One sequence slot
    (``max_num_seqs`` 1), held by a long answer; a batch request and then an interactive one
    wait in the engine's queue (the gateway's threshold is high: nothing waits in the
    gateway). A model in ``vllm_priority_models`` sends priorities 2 and 0: the interactive
    request is served first although it arrived second; the other model sends none: FCFS."""
    profile = tmp_path / "one-slot.json"
    profile.write_text(json.dumps({**PROFILES["tiny-test"].model_dump(), "name": "one-slot",
                                   "max_num_seqs": 1}))
    sim = start_sim(serve_asgi, profile=str(profile), time_scale=5.0,
                    scheduling_policy="priority", tokens_per_response=240)
    models = [{"name": name, "served_model_name": SERVED, "replicas": [{"url": sim.url}]}
              for name in ("m", "m-prio")]
    s = flow_settings(sim.url, models=models, vllm_priority_models=["m-prio"],
                      saturation={"in_flight": 8})
    url = str(serve_asgi(create_app(s, assemble(s))).url)
    firsts: list[str] = []

    def ask(key: str, max_tokens: int) -> None:
        with openai.OpenAI(base_url=url + "/v1", api_key=KEYS[key], max_retries=0) as c:
            stream = c.chat.completions.create(
                model=model, messages=[{"role": "user", "content": key}],
                max_tokens=max_tokens, stream=True)
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content and key not in firsts:
                    firsts.append(key)

    def engine_waiting(n: int) -> None:
        deadline = time.monotonic() + 20
        while sim.stats()["engine"]["waiting"] != n:
            assert time.monotonic() < deadline, f"never {n} waiting in the engine"
            time.sleep(0.01)

    with ThreadPoolExecutor(3) as pool:
        holder = pool.submit(ask, "holder", 240)  # ~0.6 model s x 5: the slot stays taken
        deadline = time.monotonic() + 20
        while "holder" not in firsts:
            assert time.monotonic() < deadline and not holder.done(), "holder never started"
            time.sleep(0.01)
        batch = pool.submit(ask, "batch-2", 2)
        engine_waiting(1)
        interactive = pool.submit(ask, "interactive", 2)
        engine_waiting(2)
        for f in (holder, batch, interactive):
            f.result(timeout=60)
    assert firsts[0] == "holder" and firsts[1] == first


def test_below_saturation_the_relay_path_is_unchanged(
    serve_asgi: Callable[..., Any], rigs: Callable[..., Rig],
) -> None:
    rig = rigs(saturation={"in_flight": 4})
    plain_sim = rig.sim
    plain_settings = parse({**rig.settings.model_dump(mode="json", exclude={"flow_control"}),
                            "keys": [{"id": k, "sha256": sha(v), "models": ["*"]}
                                     for k, v in KEYS.items()]}, {})
    plain_gateway = Gateway.of(plain_settings)
    assert plain_gateway.flow is None
    plain_url = str(serve_asgi(create_app(plain_settings, plain_gateway)).url)

    def streamed(url: str) -> tuple[list[Any], Any]:
        with openai.OpenAI(base_url=url + "/v1", api_key=KEYS["std"], max_retries=0) as c:
            stream = c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "same prompt"}], stream=True,
                max_tokens=12, stream_options={"include_usage": True})
            events = [(ch.choices[0].delta.content if ch.choices else None,
                       ch.usage.completion_tokens if ch.usage else None) for ch in stream]
        return events, plain_sim.stats()["last_body"]

    flowed, plain = streamed(rig.url), streamed(plain_url)
    assert flowed == plain  # same events, same body upstream (no priority field added)
    assert len(flowed[0]) > 3
    (record,) = rig.recorder.wait(1)
    assert record.flow == {"class": "standard", "outcome": "immediate", "wait_ms": 0}
    assert record.outcome == "ok"
    assert rig.pool.replicas[0].outstanding == 0 and sum(rig.queued().values()) == 0


def test_one_key_cannot_fill_its_class_queue(rigs: Callable[..., Rig]) -> None:
    """max_queue 4, max_queue_share 0.5: one key queues 2; its third is refused with
    ``flow_queue_full`` (naming the limit) while another key of the class still queues."""
    rig = rigs(classes=[{"name": "interactive", "max_queue": 5},
                        {"name": "standard", "max_queue": 5},
                        {"name": "batch", "max_queue": 4, "max_queue_share": 0.5}])
    rig.hold()
    waiting = [rig.submit("batch-1"), rig.submit("batch-1")]
    rig.wait_queued(2)
    refused = rig.submit("batch-1").result(timeout=30)
    assert isinstance(refused, openai.RateLimitError)
    assert refused.code == "flow_queue_full" and refused.status_code == 429
    assert "its share of the queue of class 'batch' (2 of 4" in str(refused.message)
    assert int(refused.response.headers["retry-after"]) >= 1
    waiting.append(rig.submit("batch-2"))
    rig.wait_queued(3)
    rig.release()
    assert all(f.result(timeout=30).http_response.status_code == 200 for f in waiting)
    shed = [r for r in rig.recorder.wait(5) if r.error_code == "flow_queue_full"]
    assert len(shed) == 1 and shed[0].flow is not None
    assert shed[0].flow["outcome"] == "flow_queue_full"


def test_queued_bodies_have_a_byte_budget_and_refusals_name_it(
    rigs: Callable[..., Rig],
) -> None:
    """max_queued_body_bytes 3000: two ~1.3 kB bodies queue, a third gets 429
    ``queue_bytes_full``; a 5 kB body could never queue: 413 ``body_exceeds_queue_budget``.
    Bodies leave the budget when their requests leave the queue."""
    rig = rigs(max_queued_body_bytes=3000)
    rig.hold()
    pad = "x" * 1200
    waiting = [rig.submit("batch-1", user=pad), rig.submit("batch-2", user=pad)]
    rig.wait_queued(2)
    assert 2400 < rig.gate.queued_bytes < 3000
    full = rig.submit("interactive", user=pad).result(timeout=30)
    assert isinstance(full, openai.RateLimitError) and full.code == "queue_bytes_full"
    assert "max_queued_body_bytes" in str(full.message)
    assert int(full.response.headers["retry-after"]) >= 1
    big = rig.submit("batch-1", user="y" * 5000).result(timeout=30)
    assert isinstance(big, openai.APIStatusError) and big.status_code == 413
    assert big.code == "body_exceeds_queue_budget" and "3000 bytes" in str(big.message)
    rig.release()
    assert all(f.result(timeout=30).http_response.status_code == 200 for f in waiting)
    assert rig.gate.queued_bytes == 0
    # With the budget free again a request of the same size queues.
    rig.hold()
    again = rig.submit("interactive", user=pad)
    rig.wait_queued(1)
    rig.release()
    assert again.result(timeout=30).http_response.status_code == 200


def test_a_class_saturates_on_prefill_tokens_in_flight(
    serve_asgi: Callable[..., Any],
) -> None:
    """Saturation in tokens: the held request's uncached prompt (never answered, so its prefill
    stays charged) fills the replica for batch (threshold 1 token) but not for interactive
    (1,000,000): a batch request queues until it ends, an interactive one goes at once."""
    sim = start_sim(serve_asgi)
    models = [{"name": "m", "served_model_name": SERVED, "strategy": "prefix_affinity",
               "replicas": [{"url": sim.url}]}]
    s = flow_settings(sim.url, models=models, saturation={"queue_depth": 1000},
                      classes=[{"name": "interactive", "max_queue": 5,
                                "saturation": {"queue_depth": 1000, "prefill_tokens": 1e6}},
                               {"name": "standard", "max_queue": 5},
                               {"name": "batch", "max_queue": 5,
                                "saturation": {"queue_depth": 1000, "prefill_tokens": 1}}])
    rig = Rig(serve_asgi, sim, s)
    try:
        rig.hold()
        assert rig.pool.replicas[0].prefill_tokens >= 1
        queued = rig.submit("batch-1")
        rig.wait_queued(1)
        assert rig.submit("interactive").result(timeout=30).http_response.status_code == 200
        assert rig.queued()["batch"] == 1
        rig.release()
        assert queued.result(timeout=30).http_response.status_code == 200
    finally:
        rig.close()


def test_each_of_several_pods_enforces_its_share_of_in_flight(
    rigs: Callable[..., Rig],
) -> None:
    """in_flight 2 split over 2 pods: this pod sends the replica 1 request, the next queues;
    the same threshold with one pod would take both at once."""
    rig = rigs(pods=2, saturation={"in_flight": 2})
    assert rig.gate.limits[0].in_flight == 1 and rig.gate.workers == 2
    rig.hold()
    queued = rig.submit("batch-1")
    rig.wait_queued(1)
    rig.release()
    assert queued.result(timeout=30).http_response.status_code == 200
    one = rigs(saturation={"in_flight": 2})
    one.hold()
    assert one.submit("batch-1").result(timeout=30).http_response.status_code == 200
    one.release()


def test_shared_counts_hold_an_in_flight_threshold_across_pods(
    serve_asgi: Callable[..., Any], redis_prefix: str,
) -> None:
    """flow_control.shared (real Redis): pod 1 holds the replica's one batch slot; pod 2 learns
    it from Redis and queues its batch request until pod 1's request ends."""
    sim = start_sim(serve_asgi)
    s = flow_settings(sim.url, saturation={"in_flight": 1},
                      shared={"redis_url": "redis://127.0.0.1:6379/0",
                              "key_prefix": redis_prefix, "interval_s": 0.05})
    pod1, pod2 = Rig(serve_asgi, sim, s), Rig(serve_asgi, sim, s)
    try:
        pod1.hold()
        wait_for(lambda: sum(pod2.pool.replicas[0].peer_in_flight) == 1,
                 "pod 2 sees pod 1's request")
        queued = pod2.submit("batch-1")
        pod2.wait_queued(1)
        assert pod2.pool.replicas[0].outstanding == 0  # nothing sent by pod 2
        pod1.release()
        assert queued.result(timeout=30).http_response.status_code == 200
        wait_for(lambda: not any(pod2.pool.replicas[0].peer_in_flight), "counts withdrawn")
    finally:
        pod1.close()
        pod2.close()


def _audited(serve_asgi: Callable[..., Any], tmp_path: Path) -> tuple[Rig, str]:
    sim = start_sim(serve_asgi)
    key, _ = write_key_pair(Signer.generate(), tmp_path / "audit.key")
    store = f"sqlite://{tmp_path / 'audit.db'}"
    audit = {"store": store, "signing_key_file": str(key),
             "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key")),
             "replica_id": "gw1"}
    s = flow_settings(sim.url, classes=[
        {"name": "interactive"}, {"name": "standard"}, {"name": "batch", "max_queue": 1}],
        _extra={"audit": audit})
    rig = Rig(serve_asgi, sim, s, assemble(s))
    return rig, store


def _records(store: str, request_id: str) -> list[Record]:
    async def run() -> list[Record]:
        s = open_store(store, read_only=True)
        await s.open()
        try:
            return await s.find_request(request_id)
        finally:
            await s.close()

    return asyncio.run(run())


def test_queued_and_shed_requests_are_in_the_audit_log(
    serve_asgi: Callable[..., Any], tmp_path: Path,
) -> None:
    rig, store = _audited(serve_asgi, tmp_path)
    try:
        rig.hold()
        served = rig.submit("batch-1")
        rig.wait_queued(1)
        shed = rig.submit("batch-2").result(timeout=30)
        assert isinstance(shed, openai.RateLimitError) and shed.code == "queue_full"
        rig.release()
        served_id = _request_id(served.result(timeout=30))
        shed_id = shed.response.headers["x-request-id"]
        wait_for(lambda: len(_records(store, served_id)) == 2, "the completion record")
        started, completed = sorted(_records(store, served_id), key=lambda r: r.seq)
        assert started.type == "request.started"
        flow = started.decoded()["data"]["flow"]
        assert flow["class"] == "batch" and flow["outcome"] == "dispatched"
        assert isinstance(flow["wait_ms"], int) and flow["wait_ms"] >= 0
        assert completed.decoded()["data"]["outcome"] == "ok"
        (denied,) = _records(store, shed_id)
        assert denied.type == "request.denied"
        data = denied.decoded()["data"]
        assert data["error_code"] == "queue_full" and data["status"] == 429
        assert data["flow"] == {"class": "batch", "outcome": "queue_full", "wait_ms": 0}
    finally:
        rig.close()


def test_saturation_from_scraped_vllm_metrics_queues_and_then_dispatches(
    serve_asgi: Callable[..., Any],
) -> None:
    sim = start_sim(serve_asgi, profile="tiny-test", time_scale=20.0)
    s = flow_settings(sim.url, saturation={"queue_depth": 1},
                      _extra={"routing": {"metrics_interval_s": 0.05}})
    gw = Gateway.of(s, observers=[recorder := Recorder()])
    url = str(serve_asgi(create_app(s, gw)).url)
    replica = gw.router.pools["m"].replicas[0]
    wait_for(lambda: replica.signals is not None, "a first scrape")

    def one(i: int) -> int:
        with openai.OpenAI(base_url=url + "/v1", api_key=KEYS["std"], max_retries=0,
                           timeout=60) as c:
            r = c.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=16)
            return r.http_response.status_code

    with ThreadPoolExecutor(max_workers=8) as ex:
        statuses = list(ex.map(one, range(8)))
    assert statuses == [200] * 8
    flows = [r.flow for r in recorder.wait(8)]
    assert all(f is not None for f in flows)
    outcomes = {f["outcome"] for f in flows if f is not None}
    assert "dispatched" in outcomes  # some waited in the gateway for the scraped queue to drain


def test_queue_length_and_wait_per_class_are_on_the_metrics_page(
    serve_asgi: Callable[..., Any],
) -> None:
    sim = start_sim(serve_asgi)
    s = flow_settings(sim.url, classes=[
        {"name": "interactive"}, {"name": "standard"}, {"name": "batch", "max_queue": 1}])
    tel = Telemetry(TelemetrySettings(admin={"port": 0}))
    rig = Rig(serve_asgi, sim, s, assemble(s, telemetry=tel))

    def metrics() -> dict[tuple[str, str | None, str | None], float]:
        text = httpx.get(f"http://127.0.0.1:{tel.admin.port}/metrics", timeout=5).text
        return {(smp.name, smp.labels.get("sg_flow_class"), smp.labels.get("sg_flow_outcome")):
                smp.value
                for fam in text_string_to_metric_families(text) for smp in fam.samples
                if smp.name.startswith("sg_gateway_flow")}

    try:
        rig.hold()
        served = rig.submit("batch-1")
        rig.wait_queued(1)
        shed = rig.submit("batch-2").result(timeout=30)
        assert isinstance(shed, openai.RateLimitError)
        m = metrics()
        assert m[("sg_gateway_flow_queue_length", "batch", None)] == 1
        assert m[("sg_gateway_flow_queue_length", "interactive", None)] == 0
        rig.release()
        assert served.result(timeout=30).http_response.status_code == 200
        wait_for(lambda: metrics().get(("sg_gateway_flow_wait_seconds_count", "batch", None))
                 == 1, "the wait of the dispatched request")
        m = metrics()
        assert m[("sg_gateway_flow_queue_length", "batch", None)] == 0
        assert m[("sg_gateway_flow_requests_total", "batch", "queue_full")] == 1
        assert m[("sg_gateway_flow_requests_total", "batch", "dispatched")] == 1
        assert m[("sg_gateway_flow_requests_total", "batch", "immediate")] == 1  # the holder
    finally:
        rig.close()


def test_a_priority_header_naming_several_classes_is_refused_whatever_their_order(
    rigs: Callable[..., Rig],
) -> None:
    """Two ``x-priority`` fields (or one comma list, the same thing in HTTP) are ambiguous: the
    request is refused with 400 whatever their order, before anything is forwarded; a refusal
    names the key's own class, not one an earlier field lowered it to."""
    rig = rigs()
    fields = {"interactive": [(b"x-priority", b"standard"), (b"x-priority", b"interactive")],
              "reversed": [(b"x-priority", b"interactive"), (b"x-priority", b"standard")],
              "comma": [(b"x-priority", b"standard, batch")]}
    for case, extra in fields.items():
        body = json.dumps({"model": "m", "max_tokens": 4,
                           "messages": [{"role": "user", "content": "hi"}]})
        headers = [(b"authorization", f"Bearer {KEYS['interactive']}".encode()),
                   (b"content-type", b"application/json"), *extra]
        resp = httpx.post(rig.url + "/v1/chat/completions", content=body, headers=headers,
                          timeout=30)
        assert resp.status_code == 400, (case, resp.text)
        err = resp.json()["error"]
        assert err["code"] == "unknown_priority_class" and err["param"] == "x-priority", case
        assert "more than one" in err["message"], case
    raised = rig.submit("std", extra_headers={"x-priority": "interactive"}).result(30)
    assert isinstance(raised, openai.PermissionDeniedError)
    assert "('standard')" in raised.message  # the key's class
    assert rig.sim.stats()["received"] == 0
