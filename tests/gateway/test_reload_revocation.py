"""Revoking a key by a live reload is never blocked by the quota or class override it leaves.

An override naming no key is refused as a typo at start and by ``check-config`` (the key it
meant would run without its limit). On a reload that removed the key, refusing it kept the
revoked key working: the reload is now applied, the leftover logged and audited as a warning,
and only an override new in that reload that names nothing is refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import openai
import pytest

from gateway.config.errors import InvalidConfig
from gateway.config.loader import parse
from gateway.config.override_names import OverrideNames
from tests.gateway.helpers import BACKEND_KEY, KEY_A, KEY_B, Sim, config, sha
from tests.gateway.test_live_reload import (  # noqa: F401 (fixtures)
    KEY_C,
    Served,
    serve,
    sims,
)


def _overrides(cfg: dict[str, Any], key_id: str) -> dict[str, Any]:
    return {**cfg,
            "quotas": {"keys": {key_id: {"requests_per_minute": 1000}}},
            "flow_control": {"enabled": True,
                             "classes": [{"name": "interactive"}, {"name": "batch"}],
                             "default_class": "interactive",
                             "keys": {key_id: {"class": "batch"}}}}


def _without(cfg: dict[str, Any], key_id: str) -> dict[str, Any]:
    return {**cfg, "keys": [k for k in cfg["keys"] if k["id"] != key_id]}


def test_parse_refuses_an_unmatched_override_unless_the_running_names_hold_it() -> None:
    base = _overrides(config(["http://127.0.0.1:1"]), "team-b")
    running = parse(base, {"VLLM_KEY": BACKEND_KEY})
    assert running.warnings == ()
    revoked = _without(base, "team-b")
    with pytest.raises(InvalidConfig) as start:  # at start: a typo
        parse(revoked, {"VLLM_KEY": BACKEND_KEY})
    assert [p.key for p in start.value.problems] == ["quotas.keys.team-b",
                                                     "flow_control.keys.team-b"]
    assert "no key has the key id 'team-b' (known: team-a)" in str(start.value)

    reloaded = parse(revoked, {"VLLM_KEY": BACKEND_KEY},
                     tolerate=OverrideNames.known_to(running))
    assert [w.key for w in reloaded.warnings] == ["quotas.keys.team-b",
                                                  "flow_control.keys.team-b"]
    assert all("any more" in w.problem and "a restart refuses it" in w.problem
               for w in reloaded.warnings)
    # A leftover the running configuration already carries stays tolerated ...
    again = parse(revoked, {"VLLM_KEY": BACKEND_KEY}, tolerate=OverrideNames.known_to(reloaded))
    assert len(again.warnings) == 2
    # A key renamed with the same secret is no revocation: its old id's override is refused
    # (the renamed key would run without its limit and class) ...
    renamed = {**base, "keys": [k if k["id"] != "team-b" else {**k, "id": "team-b2"}
                                for k in base["keys"]]}
    with pytest.raises(InvalidConfig) as rename:
        parse(renamed, {"VLLM_KEY": BACKEND_KEY}, tolerate=OverrideNames.known_to(running))
    assert [p.key for p in rename.value.problems] == ["quotas.keys.team-b",
                                                      "flow_control.keys.team-b"]
    # ... and so is a team override whose keys moved to another team with their secrets.
    teamed = {**base, "quotas": {"teams": {"a": {"requests_per_minute": 2}}}}
    team_running = parse(teamed, {"VLLM_KEY": BACKEND_KEY})
    moved = {**teamed, "keys": [k if k.get("team") != "a" else {**k, "team": "A"}
                                for k in teamed["keys"]]}
    with pytest.raises(InvalidConfig) as move:
        parse(moved, {"VLLM_KEY": BACKEND_KEY}, tolerate=OverrideNames.known_to(team_running))
    assert [p.key for p in move.value.problems] == ["quotas.teams.a"]
    gone = {**teamed, "keys": [k for k in teamed["keys"] if k.get("team") != "a"]}
    assert [w.key for w in parse(gone, {"VLLM_KEY": BACKEND_KEY},
                                 tolerate=OverrideNames.known_to(team_running)).warnings] == [
        "quotas.teams.a"]
    # ... and a name new in this reload is a typo, as at start.
    typo = {**revoked, "quotas": {"keys": {"team-b": {"requests_per_minute": 1000},
                                           "team-aa": {"requests_per_minute": 5}}}}
    with pytest.raises(InvalidConfig) as refused:
        parse(typo, {"VLLM_KEY": BACKEND_KEY}, tolerate=OverrideNames.known_to(reloaded))
    assert [p.key for p in refused.value.problems] == ["quotas.keys.team-aa"]


def test_a_reload_that_removes_a_key_revokes_it_though_its_overrides_stay(
    sims: tuple[Sim, Sim], serve: Callable[[dict[str, Any]], Served],  # noqa: F811
) -> None:
    sim_a, _ = sims
    gw = serve(_overrides(config([sim_a.url]), "team-b"))
    chat: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert gw.client(KEY_B).chat.completions.create(model="other-model", **chat).choices

    revoked = _without(gw.cfg, "team-b")
    gw.write(revoked)
    record = gw.hup_and_wait("config.reloaded")
    assert [w.split(": ", 2)[1] for w in record["warnings"]] == [
        "quotas.keys.team-b", "flow_control.keys.team-b"]
    assert all(w.startswith(f"{gw.path}:") for w in record["warnings"])
    assert len(gw.log_lines("applied with 2 warning(s)")) == 1
    with pytest.raises(openai.AuthenticationError):
        gw.client(KEY_B).chat.completions.create(model="other-model", **chat)
    assert gw.client(KEY_A).chat.completions.create(model="default", **chat).choices

    # A typo new in a reload is refused whole, as at start: the new key does not apply.
    with_c = [*revoked["keys"], {"id": "team-c", "sha256": sha(KEY_C), "models": ["*"]}]
    gw.write({**revoked, "keys": with_c,
              "quotas": {"keys": {**revoked["quotas"]["keys"],
                                  "team-cc": {"requests_per_minute": 5}}}})
    refused = gw.hup_and_wait("config.reload_refused")
    assert [p.split(": ", 2)[1] for p in refused["problems"]] == ["quotas.keys.team-cc"]
    with pytest.raises(openai.AuthenticationError):
        gw.client(KEY_C).models.list()

    # The leftover alone, with the new key: applied (the running configuration carries it).
    gw.write({**revoked, "keys": with_c})
    assert len(gw.hup_and_wait("config.reloaded")["warnings"]) == 2
    assert gw.client(KEY_C).models.list().data

    # What the warning says: a restart (and check-config) refuses the leftover.
    res = subprocess.run([sys.executable, "-m", "gateway.cli", "check-config", str(gw.path),
                          "--json"], capture_output=True, text=True, check=False,
                         env={**os.environ, "VLLM_KEY": "backend-key"})
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert "quotas.keys.team-b" in json.dumps(doc), doc
    assert gw.proc.poll() is None


def test_a_key_and_its_overrides_removed_in_one_edit_and_a_class_changed_live(
    sims: tuple[Sim, Sim], serve: Callable[[dict[str, Any]], Served],  # noqa: F811
) -> None:
    """``flow_control.keys``/``teams`` reload like ``quotas.keys``/``teams``: deleting a key
    with its class override was refused as a restart-only change (the revoked key kept
    working); a key's new class applies to its next requests."""
    sim_a, _ = sims
    gw = serve(_overrides(config([sim_a.url]), "team-b"))
    chat: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    revoked = _without(gw.cfg, "team-b")
    revoked = {**revoked, "quotas": {"keys": {}},
               "flow_control": {**revoked["flow_control"], "keys": {}}}
    gw.write(revoked)
    record = gw.hup_and_wait("config.reloaded")
    assert "warnings" not in record
    with pytest.raises(openai.AuthenticationError):
        gw.client(KEY_B).chat.completions.create(model="other-model", **chat)

    def last_class() -> str:
        gw.client(KEY_A).chat.completions.create(model="default", **chat)
        flow: dict[str, Any] = gw.records("request.started")[-1]["flow"]
        return str(flow["class"])

    assert last_class() == "interactive"
    gw.write({**revoked, "flow_control": {**revoked["flow_control"],
                                          "keys": {"team-a": {"class": "batch"}}}})
    gw.hup_and_wait("config.reloaded")
    assert last_class() == "batch"
