"""Per-person limits through the real gateway (uvicorn on loopback, openai SDK, vLLM simulator):
requests per minute per subject, a token budget shared by an organisation across teams, the
memory and the Redis quota backends, and ``GET /v1/usage`` showing only the caller's own
consumption."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.audit import generate_key_file
from tests.gateway.helpers import KEY_A, Sim, settings
from tests.gateway.identity.jwtkit import SigningKey, identity_section, write_jwks

CHAT = {"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5}


def _gateway(serve_asgi: Callable[..., Any], sim: Sim, tmp_path: Path, quotas: dict[str, Any],
             idp: SigningKey) -> str:
    jwks = tmp_path / "jwks.json"
    section = identity_section(jwks, write_jwks(jwks, idp))
    section["pseudonym_key_file"] = str(generate_key_file(tmp_path / "pseudonym.key"))
    section["rules"] = [
        {"id": "staff", "match": {"groups": "ml-engineers"}, "team_claim": "dept",
         "org": "acme", "models": ["*"]},
    ]
    s = settings([sim.url], identity=section, quotas=quotas)
    return str(serve_asgi(create_app(s, assemble(s))).url)


def _chat(url: str, token: str) -> int:
    r = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=20,
                   headers={"authorization": f"Bearer {token}"})
    return r.status_code


@pytest.fixture(params=["memory", "redis"])
def quota_backend(request: pytest.FixtureRequest, redis_prefix: str) -> dict[str, Any]:
    if request.param == "memory":
        return {"backend": "memory"}
    return {"backend": "redis", "redis_url": "redis://127.0.0.1:6379/0",
            "key_prefix": redis_prefix}


def test_requests_per_minute_are_per_person(
        serve_asgi: Callable[..., Any], sim: Sim, tmp_path: Path,
        quota_backend: dict[str, Any]) -> None:
    idp = SigningKey("k1")
    url = _gateway(serve_asgi, sim, tmp_path, {
        **quota_backend, "defaults": {"key": {"requests_per_minute": 2}}}, idp)
    alice = idp.token(sub="alice", dept="research")
    bob = idp.token(sub="bob", dept="research")  # same team, another person
    assert [_chat(url, alice) for _ in range(3)] == [200, 200, 429]
    assert [_chat(url, bob) for _ in range(2)] == [200, 200]
    with openai.OpenAI(base_url=url + "/v1", api_key=bob, max_retries=0) as client:
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(**CHAT)  # type: ignore[call-overload]


def test_an_organisation_budget_is_shared_and_usage_is_self_service(
        serve_asgi: Callable[..., Any], sim: Sim, tmp_path: Path,
        quota_backend: dict[str, Any]) -> None:
    idp = SigningKey("k1")
    url = _gateway(serve_asgi, sim, tmp_path, {
        **quota_backend, "defaults": {"key": {"tokens_per_day": 1_000_000}},
        "orgs": {"acme": {"tokens_per_day": 60}}}, idp)
    alice = idp.token(sub="alice", dept="research")
    carol = idp.token(sub="carol", dept="sales")  # another team of the same organisation
    statuses = [_chat(url, alice) for _ in range(30)]
    assert 429 in statuses, statuses  # the organisation's day budget ran out
    first_refusal = statuses.index(429)
    assert _chat(url, carol) == 429  # carol shares it although she sent nothing yet

    mine = httpx.get(url + "/v1/usage", headers={"authorization": f"Bearer {alice}"},
                     timeout=10).json()
    hers = httpx.get(url + "/v1/usage", headers={"authorization": f"Bearer {carol}"},
                     timeout=10).json()
    assert mine["caller"]["org"] == "acme" and mine["caller"]["team"] == "research"
    assert mine["caller"]["key_id"] != hers["caller"]["key_id"]
    assert "alice" not in str(mine) and "carol" not in str(hers)
    by_subject = {e["subject"]: e for e in mine["quotas"]}
    assert set(by_subject) == {"key", "org"}
    alice_used = by_subject["key"]["tokens_used"]["day"]
    assert alice_used > 0 and first_refusal > 0
    assert by_subject["key"]["tokens_remaining"]["day"] == 1_000_000 - alice_used
    org = by_subject["org"]
    assert org["limits"]["tokens_per_day"] == 60
    assert org["tokens_remaining"]["day"] == max(0, 60 - org["tokens_used"]["day"])
    carols = {e["subject"]: e for e in hers["quotas"]}
    assert carols["key"]["tokens_used"]["day"] == 0  # nothing of alice's
    assert carols["org"]["tokens_used"] == org["tokens_used"]  # the shared budget

    keyed = httpx.get(url + "/v1/usage", headers={"authorization": f"Bearer {KEY_A}"},
                      timeout=10).json()
    assert keyed["caller"] == {"key_id": "team-a", "team": "a", "org": None, "issuer": None,
                               "subject": None}
    assert httpx.get(url + "/v1/usage", timeout=10).status_code == 401
