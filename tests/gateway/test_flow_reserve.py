"""flow_control.reserve through the real gateway: two vLLM simulators on loopback, openai SDK.

Replica 0 is the reserve (the first in pool order). Requests are held on a simulator with its
``hang`` fault, so what runs where is read from each simulator's own request count.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.assembly import assemble
from gateway.config.errors import InvalidConfig
from gateway.config.loader import load
from gateway.fleet.replica import Replica
from gateway.flow.reserve import Reserve, ReserveState
from gateway.flow.settings import FlowControlSettings
from gateway.telemetry import Telemetry
from gateway.telemetry.settings import TelemetrySettings
from tests.gateway.helpers import SERVED, Sim, start_sim
from tests.gateway.test_flow_control import Rig, flow_settings, wait_for


def _section(**reserve: Any) -> dict[str, Any]:
    """Two classes: interactive (2 per replica) and batch (1 per replica, as configured)."""
    return {
        "classes": [{"name": "interactive", "max_queue": 10, "max_wait_s": 20},
                    {"name": "batch", "max_queue": 20, "max_wait_s": 20,
                     "saturation": {"in_flight": 1}}],
        "default_class": "batch",
        "saturation": {"in_flight": 2},
        "keys": {"interactive": {"class": "interactive"}, "batch-1": {"class": "batch"},
                 "holder": {"class": "batch"}},
        "reserve": {"replicas": 1, **reserve},
    }


class Pair:
    """Two simulators behind one flow-controlled gateway (replica 0 first in the pool)."""

    def __init__(self, serve_asgi: Callable[..., Any], **reserve: Any) -> None:
        self.sims: list[Sim] = [start_sim(serve_asgi), start_sim(serve_asgi)]
        models = [{"name": "m", "served_model_name": SERVED,
                   "replicas": [{"url": s.url} for s in self.sims]}]
        s = flow_settings(self.sims[0].url, models=models, **_section(**reserve))
        self.telemetry = Telemetry(TelemetrySettings.model_validate({"admin": {"port": 0}}))
        self.rig = Rig(serve_asgi, self.sims[0], s, assemble(s, telemetry=self.telemetry))
        self.socks: list[socket.socket] = []

    def chats(self, i: int) -> int:
        """Chat requests simulator ``i`` received."""
        return sum(1 for h in self.sims[i].stats()["history"]
                   if h["path"] == "/v1/chat/completions")

    def hold(self, who: str, on: int) -> None:
        """One request of ``who`` that simulator ``on`` never answers (it must land there)."""
        before = self.chats(on)
        self.sims[on].fault(mode="hang", count=1)
        self.socks.append(self.rig.raw_request(who))
        wait_for(lambda: self.chats(on) == before + 1, f"the held request reaches sim {on}")

    def widened(self) -> int:
        rows = self.rig.gate.reserve_rows()
        assert [m for m, _, _ in rows] == ["m"]
        return rows[0][1]

    def close(self) -> None:
        for sock in self.socks:
            sock.close()
        self.rig.close()


@pytest.fixture
def pairs(serve_asgi: Callable[..., Any]) -> Iterator[Callable[..., Pair]]:
    made: list[Pair] = []

    def make(**reserve: Any) -> Pair:
        pair = Pair(serve_asgi, **reserve)
        made.append(pair)
        return pair

    yield make
    for pair in made:
        pair.close()


def test_interactive_requests_land_on_the_batch_free_replica_while_batch_runs(
    pairs: Callable[..., Pair],
) -> None:
    """Batch keeps off replica 0 (prefill and decode), and takes replica 1's slots up to the
    interactive threshold (lift: 2 there against its own 1 per replica); interactive requests
    sent while the batch requests run all reach replica 0. Without the reserve the second
    batch request would go to replica 0 (batch's 1 per replica)."""
    pair = pairs()
    pair.hold("holder", on=1)
    pair.hold("holder", on=1)  # lift: batch holds 2 on replica 1, none on replica 0
    assert pair.chats(0) == 0
    queued = pair.rig.submit("batch-1")
    pair.rig.wait_queued(1)  # replica 1 is full for batch; replica 0 is kept free of it
    assert pair.chats(0) == 0
    for _ in range(3):
        got = pair.rig.submit("interactive").result(timeout=30)
        assert got.http_response.status_code == 200
    assert pair.chats(0) == 3 and pair.chats(1) == 2
    assert pair.widened() == 0
    assert pair.rig.queued() == {"interactive": 0, "batch": 1}
    pair.socks.pop().close()  # one batch request ends: the queued one takes its slot
    assert queued.result(timeout=30).http_response.status_code == 200
    assert pair.chats(0) == 3 and pair.chats(1) == 3


def test_a_reserved_replica_takes_lower_in_flight_batch_requests_once_the_others_are_full(
    pairs: Callable[..., Pair],
) -> None:
    """With ``lower_in_flight`` 1 the reserve takes one batch request once replica 1 is full
    for batch (lift: 2 there), and no second one: the next queues. Interactive requests still
    run on the reserve beside it, the reserve stays narrow, and when the batch request on the
    reserve ends the queued one takes its place there. (Without the setting the third batch
    request queues: the first test.) ``lower_busy_s: null`` turns off the default streak of
    5 s, so the idle reserve takes the batch request at once (the setting's behaviour before
    the default)."""
    pair = pairs(lower_in_flight=1, lower_busy_s=None)
    pair.hold("holder", on=1)
    pair.hold("holder", on=1)  # replica 1 is full for batch
    pair.hold("holder", on=0)  # so the reserved replica takes one
    queued = pair.rig.submit("batch-1")
    pair.rig.wait_queued(1)  # its one is taken: the next batch request waits
    assert (pair.chats(0), pair.chats(1)) == (1, 2)
    got = pair.rig.submit("interactive").result(timeout=30)
    assert got.http_response.status_code == 200
    assert (pair.chats(0), pair.chats(1)) == (2, 2)
    assert pair.widened() == 0
    assert pair.rig.queued() == {"interactive": 0, "batch": 1}
    pair.socks.pop().close()  # the batch request on the reserve ends
    assert queued.result(timeout=30).http_response.status_code == 200
    assert (pair.chats(0), pair.chats(1)) == (3, 2)


def test_with_lower_busy_s_batch_rides_only_on_a_reserve_its_class_keeps_busy(
    pairs: Callable[..., Pair],
) -> None:
    """With ``lower_in_flight`` 1 and ``lower_busy_s`` 0.5, replica 1 full for batch: the idle
    reserve takes no batch request (it queues), nor does it once an interactive request runs
    there, until that request has kept it busy for 0.5 s; then the queued one goes there (at
    the next decision: an interactive request that ends). Once the reserve's interactive
    requests have all ended, the streak starts again: the next batch request queues. (Without
    ``lower_busy_s`` the first batch request goes to the idle reserve at once: the test
    above.)"""
    pair = pairs(lower_in_flight=1, lower_busy_s=0.5, in_flight=4)  # capacity 4: narrow
    pair.hold("holder", on=1)
    pair.hold("holder", on=1)  # replica 1 is full for batch
    first = pair.rig.submit("batch-1")
    pair.rig.wait_queued(1)  # the reserve is idle: no batch onto it
    assert (pair.chats(0), pair.chats(1)) == (0, 2)
    state, gate = pair.rig.gate.pools["m"].reserve, pair.rig.gate
    pair.hold("interactive", on=0)  # the reserve is busy from now on ...
    got = pair.rig.submit("interactive").result(timeout=30)  # ... a decision sees it
    assert got.http_response.status_code == 200
    assert pair.rig.queued() == {"interactive": 0, "batch": 1}  # ... but not for 0.5 s yet
    assert (pair.chats(0), pair.chats(1)) == (2, 2)
    since = state.busy_since[0]
    wait_for(lambda: gate.clock() - since > 0.5, "the reserve busy for lower_busy_s")
    got = pair.rig.submit("interactive").result(timeout=30)  # it ends: dispatch runs
    assert got.http_response.status_code == 200
    assert first.result(timeout=30).http_response.status_code == 200
    assert (pair.chats(0), pair.chats(1)) == (4, 2)  # the batch request rode on the reserve
    assert pair.widened() == 0
    pair.socks[2].close()  # the reserve's interactive request ends: its streak is over
    wait_for(lambda: 0 not in state.busy_since, "the reserve's streak ends")
    pair.rig.submit("batch-1")
    pair.rig.wait_queued(1)  # replica 1 full, the reserve not busy: it waits
    assert (pair.chats(0), pair.chats(1)) == (4, 2)


def test_lower_in_flight_keeps_batch_off_an_idle_reserve_by_default(
    pairs: Callable[..., Pair],
) -> None:
    """``lower_in_flight`` 1 without ``lower_busy_s``: the default streak (5 s) applies, so
    with replica 1 full for batch a batch request queues rather than go to the idle reserve
    (with no streak it would go there at once: the test above), and an interactive request
    sent meanwhile runs on the reserve alone."""
    pair = pairs(lower_in_flight=1)
    pair.hold("holder", on=1)
    pair.hold("holder", on=1)  # replica 1 is full for batch
    pair.rig.submit("batch-1")
    pair.rig.wait_queued(1)  # the reserve is idle: the batch request waits
    got = pair.rig.submit("interactive").result(timeout=30)
    assert got.http_response.status_code == 200
    assert (pair.chats(0), pair.chats(1)) == (1, 2)
    assert pair.rig.queued() == {"interactive": 0, "batch": 1}


def test_the_reserve_widens_under_interactive_load_and_narrows_after_hold(
    pairs: Callable[..., Pair],
) -> None:
    """Capacity 2 (one reserved replica, interactive in_flight 2), widen_at 1: two interactive
    requests in flight widen the reserve, and a batch request may then go to replica 0; once
    they end and hold_s passes, batch keeps off replica 0 again. The gauges on the metrics
    page follow."""
    pair = pairs(shrink_at=0.5, hold_s=0.3)
    pair.hold("interactive", on=0)
    assert pair.widened() == 0
    pair.hold("interactive", on=0)
    pair.hold("holder", on=1)  # the next decision sees 2 of 2 in flight: widened
    assert pair.widened() == 1
    # Widened: every replica serves every class with its own thresholds (batch: 1 each).
    got = pair.rig.submit("batch-1").result(timeout=30)
    assert got.http_response.status_code == 200
    assert pair.chats(0) == 3
    page = httpx.get(f"http://127.0.0.1:{pair.telemetry.admin.port}/metrics", timeout=5).text
    gauges = {f.name: s.value for f in text_string_to_metric_families(page) for s in f.samples
              if f.name.startswith("sg_gateway_flow_reserve")}
    assert gauges == {"sg_gateway_flow_reserve_widened": 1.0,
                      "sg_gateway_flow_reserve_demand": 2.0}
    pair.socks[0].close()
    pair.socks[1].close()  # the interactive requests end: demand 0, calm since the first
    wait_for(lambda: pair.rig.gate.reserve_rows()[0][2] == 0, "demand falls to 0")
    state, gate = pair.rig.gate.pools["m"].reserve, pair.rig.gate
    assert state.widened and state.calm_since is not None  # hold_s has not passed yet
    wait_for(lambda: gate.clock() - (state.calm_since or 0.0) > 0.3, "hold_s passes")
    on_reserve, on_other = pair.chats(0), pair.chats(1)
    # Narrowed: replica 1 already holds batch's own threshold (1), but batch may use the
    # interactive one there (lift: 2), and replica 0 is kept free of it.
    got = pair.rig.submit("batch-1").result(timeout=30)
    assert got.http_response.status_code == 200
    assert pair.widened() == 0
    assert (pair.chats(0), pair.chats(1)) == (on_reserve, on_other + 1)


def test_a_reserve_needs_a_size_and_a_class_below_it_and_is_split_over_pods() -> None:
    base = {"enabled": True, "classes": [{"name": "interactive"}, {"name": "batch"}],
            "default_class": "batch"}
    with pytest.raises(ValueError, match=re.escape("reserve.in_flight: not set")):
        FlowControlSettings.model_validate({**base, "reserve": {}})
    with pytest.raises(ValueError, match=re.escape("reserve.for_class: 'batch' is the last class")):
        FlowControlSettings.model_validate({**base, "reserve": {"for_class": "batch",
                                                                 "in_flight": 4}})
    with pytest.raises(ValueError, match=re.escape("shrink_at: 0.9 is above widen_at 0.5")):
        FlowControlSettings.model_validate({**base, "reserve": {
            "in_flight": 4, "widen_at": 0.5, "shrink_at": 0.9}})
    # lower_busy_s gates lower_in_flight: alone it would be ignored, silently.
    with pytest.raises(ValueError, match=re.escape(
            "lower_busy_s: 5.0 has no effect with lower_in_flight 0")):
        FlowControlSettings.model_validate({**base, "reserve": {
            "in_flight": 4, "lower_busy_s": 5}})
    ok = FlowControlSettings.model_validate({**base, "reserve": {"in_flight": 4}})
    assert ok.reserve is not None
    # lower_busy_s defaults to 5 s, in effect only with lower_in_flight; null turns it off.
    assert ok.reserve.lower_busy_s == 5.0
    off = FlowControlSettings.model_validate({**base, "reserve": {
        "in_flight": 4, "lower_in_flight": 2, "lower_busy_s": None}})
    assert off.reserve is not None and off.reserve.lower_busy_s is None
    reserve = Reserve(ok.reserve, 0, ok.limits(), stale_s=1.0, workers=1)
    assert reserve.capacity == 4 and not ReserveState().widened
    # Without a shared backend each of 2 pods sizes the reserve by its share of in_flight.
    pods = FlowControlSettings.model_validate({**base, "pods": 2, "reserve": {"in_flight": 4}})
    assert pods.reserve is not None
    assert Reserve(pods.reserve, 0, pods.limits(), 1.0, pods.processes,
                   processes=pods.processes).capacity == 2
    # ... and takes its share of lower_in_flight (3 // 2: 1 each).
    lower = FlowControlSettings.model_validate({**base, "pods": 2, "reserve": {
        "in_flight": 4, "lower_in_flight": 3}})
    assert lower.reserve is not None
    assert Reserve(lower.reserve, 0, lower.limits(), 1.0, lower.processes,
                   processes=lower.processes).lower_in_flight == 1


def test_other_pods_requests_count_in_the_demand_with_shared_counts() -> None:
    """With flow_control.shared the demand adds the other processes' requests (the Redis
    counts kept in ``peer_in_flight``): every pod widens on the fleet's demand, not its own."""
    s = FlowControlSettings.model_validate({
        "enabled": True, "classes": [{"name": "interactive"}, {"name": "batch"}],
        "default_class": "batch", "saturation": {"in_flight": 2},
        "shared": {"redis_url": "redis://127.0.0.1:6379/0"},
        "reserve": {"hold_s": 0}})
    assert s.reserve is not None
    reserve = Reserve(s.reserve, 0, s.limits(), 1.0, 1, processes=1)
    replicas = [Replica(model="m", index=i, url=f"http://r{i}") for i in range(2)]
    state = ReserveState()
    replicas[0].flow_in_flight[:] = [1, 0]
    assert [r.index for r in reserve.room(state, replicas, 1, False, 0.0)] == [1]
    assert not state.widened and state.demand == 1
    replicas[1].peer_in_flight[:] = [1, 0]  # another pod's interactive request
    assert [r.index for r in reserve.room(state, replicas, 1, False, 1.0)] == [0, 1]
    assert state.widened and state.demand == 2
    replicas[1].peer_in_flight[:] = [0, 0]
    replicas[0].flow_in_flight[:] = [0, 0]
    reserve.update(state, replicas, False, 2.0)  # calm from now; hold_s 0
    assert [r.index for r in reserve.room(state, replicas, 1, False, 2.0)] == [1]
    assert not state.widened


def _load_problem(tmp_path: Path, flow: dict[str, Any], sizes: tuple[int, ...] = (2, 2),
                  batch: bool = False) -> str:
    """The one problem of a config file whose models ``big`` and ``small`` have ``sizes``
    replicas (``big`` with alias ``fast``) and whose flow_control section is ``flow``."""
    models = [{"name": name, "aliases": ["fast"] * (name == "big"),
               "replicas": [{"url": f"http://10.0.0.{i + 10 * n}:8000"} for i in range(size)]}
              for n, (name, size) in enumerate(zip(("big", "small"), sizes, strict=True))]
    doc: dict[str, Any] = {"models": models, "flow_control": {
        "enabled": True, "classes": [{"name": "interactive"}, {"name": "batch"}],
        "default_class": "batch", "saturation": {"in_flight": 4}, **flow}}
    if batch:
        doc["batch"] = {"enabled": True, "database": str(tmp_path / "batch.db")}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    with pytest.raises(InvalidConfig) as exc:
        load(path, {})
    assert len(exc.value.problems) == 1, exc.value
    problem = exc.value.problems[0]
    lines = path.read_text(encoding="utf-8").splitlines()
    # On the line of the key (of its mapping when not written), or of the item of ``key[i]``.
    parent, last = problem.key.rsplit(".", 1)
    assert problem.line is not None, problem
    text = lines[problem.line - 1].strip()
    assert (text.startswith("- ") if "[" in last else text.startswith(
        (f"{last}:", f"{parent.rsplit('.', 1)[-1]}:"))), (problem, text)
    return f"{problem.key}: {problem.problem}"


def test_a_setting_naming_no_flow_controlled_model_is_refused(tmp_path: Path) -> None:
    """A typo in a model name of flow_control was accepted and reserved (or prioritised)
    nothing: every setting that names models is checked against the models it acts on."""
    assert _load_problem(tmp_path, {"reserve": {"models": ["bgi"]}}) == (
        "flow_control.reserve.models[0]: 'bgi' is not a model name (models: big, small)")
    assert _load_problem(tmp_path, {"reserve": {"models": ["fast"]}}) == (
        "flow_control.reserve.models[0]: 'fast' is an alias of 'big'; list the model name")
    # The reserve acts on flow-controlled models only: 'small' is not one.
    assert _load_problem(tmp_path, {"models": ["big"], "reserve": {"models": ["small"]}}) == (
        "flow_control.reserve.models[0]: 'small' is not under flow control, so this would "
        "never apply to it (flow_control.models: big); add it there or remove it here")
    assert _load_problem(tmp_path, {"models": ["big"], "vllm_priority_models": ["small"]}) == (
        "flow_control.vllm_priority_models[0]: 'small' is not under flow control, so this "
        "would never apply to it (flow_control.models: big); add it there or remove it here")
    assert _load_problem(tmp_path, {"models": ["big", "smal"]}) == (
        "flow_control.models[1]: 'smal' is not a model name (models: big, small)")


def test_a_reserve_that_can_never_reserve_a_replica_is_refused(tmp_path: Path) -> None:
    """A pool with no more replicas than reserve.replicas has no reserve: refused for a model
    the reserve names, and when no model it applies to has more."""
    assert _load_problem(tmp_path, {"reserve": {"models": ["small"]}}, sizes=(2, 1)) == (
        "flow_control.reserve.models[0]: 'small' has 1 replica, not more than "
        "reserve.replicas 1: no replica would be left to the classes below, so it would "
        "never have a reserve; give it more replicas or set reserve.replicas lower")
    assert _load_problem(tmp_path, {"reserve": {"replicas": 2}}, sizes=(2, 1)) == (
        "flow_control.reserve.replicas: 2 is not less than the replicas of any model the "
        "reserve applies to ('big' (2), 'small' (1)): no model would ever have a reserve; set "
        "it lower or give the models more replicas")
    # One model with room is enough when the reserve names none (the others have none).
    doc = {"models": [{"name": n, "replicas": [{"url": f"http://10.0.0.{i + k}:8000"}
                                               for i in range(k)]}
                      for n, k in (("big", 2), ("small", 1))],
           "flow_control": {"enabled": True, "classes": [{"name": "interactive"},
                                                          {"name": "batch"}],
                            "default_class": "batch", "saturation": {"in_flight": 4},
                            "reserve": {}}}
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert load(tmp_path / "ok.yaml", {}).flow_control.reserve is not None


def test_a_batch_priority_class_that_is_no_flow_class_is_refused(tmp_path: Path) -> None:
    """batch.priority_class names a flow class: one that is not (the default 'batch' with
    classes of other names) let batch requests run in their key's class, interactive too."""
    flow = {"classes": [{"name": "interactive"}, {"name": "bulk"}], "default_class": "bulk"}
    assert _load_problem(tmp_path, flow, batch=True) == (
        "batch.priority_class: 'batch' (the default) is not a class of flow_control.classes "
        "(interactive, bulk): batch requests would run in their key's class; set it to one "
        "of them")
