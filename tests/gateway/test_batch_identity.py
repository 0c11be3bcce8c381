"""Batches submitted with a bearer JWT (not an API key) run as that identity, and resume after
a restart without the token: the owner is re-authorised from what was stored (issuer, subject
pseudonym, kid, deciding rule and its claims) against the identity configuration in force, and
a changed configuration that no longer admits the owner fails the remaining lines, naming why.

Real gateway (uvicorn on loopback, assembled as ``gateway serve`` does), the vLLM simulator, the
official ``openai`` SDK with the token as its key, a real SQLite batch database.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.audit import generate_key_file
from gateway.config.loader import parse
from gateway.config.settings import GatewaySettings
from tests.gateway.helpers import SERVED, Recorder, start_sim
from tests.gateway.identity.jwtkit import SigningKey, identity_section, write_jwks
from tests.gateway.test_batch_api import error_lines, jsonl, submit, wait_batch


class Idp:
    def __init__(self, tmp_path: Path) -> None:
        self.key = SigningKey("rsa-1")
        self.jwks = tmp_path / "jwks.json"
        self.pin = write_jwks(self.jwks, self.key)
        self.pseudo = generate_key_file(tmp_path / "pseudonym.key")

    def section(self, **issuer: Any) -> dict[str, Any]:
        section = identity_section(self.jwks, self.pin, **issuer)
        section["pseudonym_key_file"] = str(self.pseudo)
        section["rules"][0]["models"] = ["m"]
        return section


def settings(sim_url: str, db: Path, identity: dict[str, Any]) -> GatewaySettings:
    return parse({
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": "m", "served_model_name": SERVED, "replicas": [{"url": sim_url}]}],
        "keys": [],
        "timeouts": {"connect_s": 2, "first_byte_s": 30, "idle_s": 30},
        "health": {"active": False},
        "logging": {"access_log": False},
        "identity": identity,
        "flow_control": {"enabled": True, "default_class": "interactive",
                         "classes": [{"name": "interactive"}, {"name": "batch"}]},
        "batch": {"database": str(db), "concurrency": 1},
    }, {})


def served(serve_asgi: Any, s: GatewaySettings, recorder: Recorder | None = None) -> Any:
    gw = assemble(s)
    if recorder is not None:
        gw = dataclasses.replace(gw, observers=(*gw.observers, recorder))
    return serve_asgi(create_app(s, gw))


def token_client(url: str, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=token, max_retries=0, timeout=30)


def answered(db: Path) -> int:
    with sqlite3.connect(db) as con:
        return int(con.execute("SELECT count(*) FROM requests WHERE done=1").fetchone()[0])


def wait_status(db: Path, status: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with sqlite3.connect(db) as con:
            now = con.execute("SELECT status FROM batches").fetchone()[0]
        if now == status:
            return
        assert time.monotonic() < deadline, now
        time.sleep(0.05)


def test_a_jwt_owned_batch_runs_as_the_identity_and_resumes_without_the_token(
        serve_asgi: Any, tmp_path: Path) -> None:
    sim = start_sim(serve_asgi, ttft_s=0.2)
    idp, db, n = Idp(tmp_path), tmp_path / "batch.db", 8
    token = idp.key.token()
    recorder = Recorder()
    first = served(serve_asgi, settings(sim.url, db, idp.section()), recorder)
    c = token_client(str(first.url), token)
    b = submit(c, jsonl(n))
    wait_batch(c, b.id, lambda b: b.request_counts.completed >= 2)
    first.stop()
    done, received = answered(db), sim.stats()["received"]
    assert 2 <= done < n
    # The token is not stored; the owner record holds the identity that was verified.
    assert token.encode() not in db.read_bytes()
    assert token.split(".")[2].encode() not in db.read_bytes()  # nor its signature
    with sqlite3.connect(db) as con:
        owner = json.loads(con.execute("SELECT principal FROM batches").fetchone()[0])
    assert owner["key_id"].startswith("id:") and owner["identity"]["rule"] == "ml"
    assert owner["identity"]["decided_by"] == [["groups", "ml-engineers"]]
    # Restarted with a rule added after the one that admitted the owner, and that rule now
    # granting another team: the owner is still admitted, with what the rule grants now.
    section = idp.section()
    section["rules"].append({"id": "later", "match": {"groups": "ops"}, "models": ["m"]})
    section["rules"][0]["team"] = "ml-platform"
    second = served(serve_asgi, settings(sim.url, db, section), recorder)
    c = token_client(str(second.url), idp.key.token())  # a fresh token of the same subject
    b = wait_batch(c, b.id, lambda b: b.status == "completed")
    assert (b.request_counts.completed, b.request_counts.failed) == (n, 0)
    assert sim.stats()["received"] == received + (n - done)
    lines = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
    assert [x["custom_id"] for x in lines] == [f"req-{i}" for i in range(n)]
    ended = recorder.wait(sim.stats()["received"])
    assert {r.key_id for r in ended} == {owner["key_id"]}
    assert [r.team for r in ended[-(n - done):]] == ["ml-platform"] * (n - done)
    assert all(r.identity is not None and r.identity["rule"] == "ml"
               and r.identity["issuer"] == idp.section()["issuers"][0]["issuer"]
               for r in ended)
    assert {r.flow["class"] for r in ended if r.flow} == {"batch"}


def _earlier_rule(idp: Idp) -> dict[str, Any]:
    section = idp.section()
    section["rules"].insert(0, {"id": "contractors", "match": {"contractor": "true"},
                                "models": []})
    return section


def _kid_revoked(idp: Idp) -> dict[str, Any]:
    return idp.section(revoked_kids=["rsa-1"])


def _issuer_removed(idp: Idp) -> dict[str, Any]:
    section = idp.section(issuer="https://another-idp.test")
    return section


def _rule_narrowed(idp: Idp) -> dict[str, Any]:
    section = idp.section()
    section["rules"][0]["match"] = {"groups": "admins"}
    return section


@pytest.mark.parametrize(("change", "code"), [
    (_earlier_rule, "identity_rules_changed"),
    (_rule_narrowed, "identity_rules_changed"),
    (_kid_revoked, "identity_key_revoked"),
    (_issuer_removed, "identity_issuer_removed"),
])
def test_an_owner_the_new_identity_config_does_not_admit_sends_nothing_more(
        serve_asgi: Any, tmp_path: Path, change: Any, code: str) -> None:
    sim = start_sim(serve_asgi, ttft_s=0.2)
    idp, db, n = Idp(tmp_path), tmp_path / "batch.db", 6
    first = served(serve_asgi, settings(sim.url, db, idp.section()))
    c = token_client(str(first.url), idp.key.token())
    b = submit(c, jsonl(n))
    wait_batch(c, b.id, lambda b: b.request_counts.completed >= 1)
    first.stop()
    done, received = answered(db), sim.stats()["received"]
    served(serve_asgi, settings(sim.url, db, change(idp)))
    wait_status(db, "completed")
    assert sim.stats()["received"] == received  # nothing more sent for that owner
    errors = error_lines(db)
    assert len(errors) == n - done
    assert {e["error"]["code"] for e in errors} == {code}
    assert {e["response"]["status_code"] for e in errors} == {401}
    assert all("created this batch" in e["error"]["message"] for e in errors)


@pytest.mark.parametrize("path", ["/v1/files", "/v1/batches"])
def test_identity_routes_hold_on_the_batch_endpoints(serve_asgi: Any, tmp_path: Path,
                                                      path: str) -> None:
    """``identity.routes`` says which credentials a path accepts; a path that accepts API keys
    only must refuse a bearer JWT there, as the relay's paths do (403
    ``credential_not_accepted``), whether it uploads a file or creates a batch."""
    sim = start_sim(serve_asgi)
    idp = Idp(tmp_path)
    section = idp.section()
    section["accept"] = ["key", "jwt"]
    section["routes"] = {path: ["key"]}
    gw = served(serve_asgi, settings(sim.url, tmp_path / "batch.db", section))
    with (token_client(str(gw.url), idp.key.token()) as client,
          pytest.raises(openai.PermissionDeniedError) as info):
        if path == "/v1/files":
            client.files.create(file=("in.jsonl", jsonl(1)), purpose="batch")
        else:
            client.batches.create(input_file_id="file-x", endpoint="/v1/chat/completions",
                                  completion_window="24h")
    assert info.value.code == "credential_not_accepted"


def test_a_route_covers_the_paths_under_it(serve_asgi: Any, tmp_path: Path) -> None:
    """``routes: {/v1/files/: [key]}`` (written with a trailing ``/``) covers every path under
    ``/v1/files``: an upload, one file, its content, its deletion refuse a bearer JWT with 403
    ``credential_not_accepted`` before the file is looked up; ``/v1/batches`` is not under it."""
    sim = start_sim(serve_asgi)
    idp = Idp(tmp_path)
    section = idp.section()
    section["accept"] = ["key", "jwt"]
    section["routes"] = {"/v1/files/": ["key"]}
    gw = served(serve_asgi, settings(sim.url, tmp_path / "batch.db", section))
    codes = []
    with token_client(str(gw.url), idp.key.token()) as client:
        for act in (lambda: client.files.create(file=("in.jsonl", jsonl(1)), purpose="batch"),
                    lambda: client.files.retrieve("file-x"),
                    lambda: client.files.content("file-x"),
                    lambda: client.files.delete("file-x")):
            with pytest.raises(openai.PermissionDeniedError) as info:
                act()
            codes.append(info.value.code)
        assert client.batches.list().data == []  # /v1/batches: JWTs accepted
    assert codes == ["credential_not_accepted"] * 4


def test_a_batch_for_an_endpoint_that_refuses_the_credential_is_refused_at_creation(
        serve_asgi: Any, tmp_path: Path) -> None:
    """``/v1/embeddings`` takes API keys only: a JWT may use ``/v1/batches`` but a batch of
    embeddings would fail on every line (its re-authorisation said the credential was "no
    longer accepted", though it never was). It is refused when created, and not stored."""
    sim = start_sim(serve_asgi)
    idp = Idp(tmp_path)
    section = idp.section()
    section["accept"] = ["key", "jwt"]
    section["routes"] = {"/v1/embeddings": ["key"]}
    gw = served(serve_asgi, settings(sim.url, tmp_path / "batch.db", section))
    with token_client(str(gw.url), idp.key.token()) as client:
        f = client.files.create(file=("in.jsonl", jsonl(1)), purpose="batch")
        e = client.files.create(file=("e.jsonl", jsonl(1, "/v1/embeddings")), purpose="batch")
        with pytest.raises(openai.PermissionDeniedError) as info:
            client.batches.create(input_file_id=e.id, endpoint="/v1/embeddings",
                                  completion_window="24h")
        assert info.value.code == "credential_not_accepted"
        assert "/v1/embeddings" in info.value.message
        assert client.batches.list().data == []
        client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                              completion_window="24h")  # JWTs accepted there
