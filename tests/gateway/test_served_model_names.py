"""A client that sends back the ``model`` a response carried (the backend's served name) works."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest

from gateway.config.loader import parse
from tests.gateway.helpers import (
    KEY_B,
    SERVED,
    Clients,
    Recorder,
    Sim,
    config,
    start_gateway,
    start_sim,
)

PRIVATE_SERVED = "org/private-model"


def _gateway(serve_asgi: Callable[..., Any], sim: Sim, rec: Recorder) -> str:
    cfg = config([sim.url])
    cfg["models"].append({"name": "private", "served_model_name": PRIVATE_SERVED,
                          "replicas": [{"url": sim.url}]})
    s = parse(cfg, {"VLLM_KEY": "k"})
    return start_gateway(serve_asgi, s, observers=[rec])


@pytest.fixture
def setup(serve_asgi: Callable[..., Any], clients: Clients) -> tuple[str, Recorder, Sim]:
    sim = start_sim(serve_asgi, models=[SERVED, PRIVATE_SERVED])
    rec = Recorder()
    return _gateway(serve_asgi, sim, rec), rec, sim


def _chat(client: openai.OpenAI, model: str) -> Any:
    return client.chat.completions.create(
        model=model, max_tokens=2, messages=[{"role": "user", "content": "hi"}])


def test_echoing_the_response_model_works_per_key(
    setup: tuple[str, Recorder, Sim], clients: Clients
) -> None:
    url, rec, sim = setup
    team_a, team_b = clients(url), clients(url, KEY_B)
    first = _chat(team_a, "llama-3.1-8b")
    assert first.model == SERVED
    again = _chat(team_a, first.model)  # the name the response carried
    assert again.model == SERVED
    echoed_b = _chat(team_b, SERVED)  # same served name, team-b's own model
    assert echoed_b.choices[0].message.content
    records = rec.wait(3)
    assert [r.canonical_model for r in records] == ["llama-3.1-8b", "llama-3.1-8b", "other-model"]
    assert sim.stats()["last_body"]["model"] == SERVED


def test_served_name_of_a_model_the_key_may_not_use_is_refused(
    setup: tuple[str, Recorder, Sim], clients: Clients
) -> None:
    url, _, _ = setup
    with pytest.raises(openai.PermissionDeniedError) as info:
        _chat(clients(url), PRIVATE_SERVED)
    assert info.value.code == "model_not_allowed"
    with pytest.raises(openai.NotFoundError):
        clients(url).models.retrieve(PRIVATE_SERVED)


def test_models_list_shows_the_served_names_each_key_may_send(
    setup: tuple[str, Recorder, Sim], clients: Clients
) -> None:
    url, _, _ = setup
    listed_a = {m.id: m.model_extra["aliases"] for m in clients(url).models.list()}
    assert listed_a == {"llama-3.1-8b": ["default", SERVED]}
    listed_b = {m.id: m.model_extra["aliases"] for m in clients(url, KEY_B).models.list()}
    assert listed_b == {"other-model": [SERVED]}
    assert clients(url).models.retrieve(SERVED).id == "llama-3.1-8b"
    assert clients(url, KEY_B).models.retrieve(SERVED).id == "other-model"
