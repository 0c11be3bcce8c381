"""Content HMAC opt-in per policy rule: keyed digests of the exact bytes, never text.

Real parts: vLLM simulator and gateway on uvicorn over loopback, the official ``openai`` SDK as
client, a real SQLite audit store; the HMAC is recomputed here with ``hmac`` from the key file.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from _audit_helpers import verify

from gateway.app import create_app
from gateway.audit import AuditSettings, Signer, generate_key_file, write_key_pair
from gateway.audit.observer import build
from gateway.audit.pseudonym import Pseudonymizer
from gateway.config.loader import parse
from gateway.egress import PolicyRoutes
from policy import Policy, PolicyError
from policy import Principal as PolicyPrincipal
from tests.gateway.audit.test_audit_gateway import records_of
from tests.gateway.helpers import BACKEND_KEY, KEY_A, KEY_B, Sim, config

PROMPT = "The secret merger codename is BLUEHERON-7731, tell nobody."

POLICY = """\
version: 1
data_classes: [internal]
destinations:
  - {{id: sim, host: 127.0.0.1, port: {port}, region: r1, jurisdiction: EU, operator: o}}
rules:
  - id: team-a-hashed
    principals: {{keys: [team-a]}}
    destinations: [sim]
    audit: {{content_hmac: true}}
  - id: everyone-else
    destinations: [sim]
"""


def independent_hmac(key_file: Path, data: bytes) -> str:
    """HMAC-SHA256(key, "content" 0x00 || data), as documented in docs/audit.md."""
    key = base64.b64decode(key_file.read_text().strip())
    return "hmac-sha256:" + hmac.new(key, b"content\x00" + data, hashlib.sha256).hexdigest()


class Gateway:
    def __init__(self, url: str, db: Path, pseudo_key: Path, signer: Signer) -> None:
        self.url, self.db, self.pseudo_key, self.signer = url, db, pseudo_key, signer
        self.sent: list[bytes] = []

    def client(self, key: str) -> openai.OpenAI:
        def capture(request: httpx.Request) -> None:
            self.sent.append(request.content)

        http = httpx.Client(event_hooks={"request": [capture]}, timeout=20)
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0,
                             http_client=http)

    def records(self, request_id: str) -> dict[str, dict[str, Any]]:
        """``data`` of each record of the request, by record type."""
        recs = records_of(f"sqlite://{self.db}", request_id)
        return {r.type: r.decoded()["data"] for r in recs}

    def db_bytes(self) -> bytes:
        return b"".join(p.read_bytes() for p in self.db.parent.glob(self.db.name + "*"))


@pytest.fixture
def gateway(serve_asgi: Callable[..., Any], sim: Sim, tmp_path: Path) -> Iterator[Gateway]:
    signer = Signer.generate()
    key, _ = write_key_pair(signer, tmp_path / "audit.key")
    pseudo = generate_key_file(tmp_path / "pseudonym.key")
    db = tmp_path / "audit.db"
    observer = build(AuditSettings.model_validate({
        "store": f"sqlite://{db}", "signing_key_file": str(key),
        "pseudonym_key_file": str(pseudo), "replica_id": "gw1",
    }))
    assert observer is not None
    cfg = config([sim.url])
    for model in cfg["models"]:
        for replica in model["replicas"]:
            replica["destination"] = "sim"
    policy = Policy.from_text(POLICY.format(port=int(sim.url.rsplit(":", 1)[1])))
    app = create_app(parse(cfg, {"VLLM_KEY": BACKEND_KEY}), policy=PolicyRoutes(policy),
                     observers=[observer])
    srv = serve_asgi(app)
    yield Gateway(srv.url, db, pseudo, signer)


def test_opted_in_rule_records_hmac_of_exact_request_and_response_bytes(
    gateway: Gateway,
) -> None:
    with gateway.client(KEY_A) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="llama-3.1-8b", max_tokens=8,
            messages=[{"role": "user", "content": PROMPT}],
        )
    body = raw.http_response.content
    completion = raw.parse().choices[0].message.content
    assert completion
    request_id = raw.http_response.headers["x-request-id"]
    recs = gateway.records(request_id)
    started, done = recs["request.started"], recs["request.completed"]
    assert started["policy_rule"] == "team-a-hashed"
    assert started["request_content_hmac"] == independent_hmac(gateway.pseudo_key,
                                                               gateway.sent[-1])
    assert done["response_content_hmac"] == independent_hmac(gateway.pseudo_key, body)
    assert done["outcome"] == "ok"
    assert "response_content_hmac" not in started and "request_content_hmac" not in done
    stored = gateway.db_bytes()
    assert PROMPT.encode() not in stored and b"BLUEHERON" not in stored
    assert completion.encode() not in stored
    assert verify(f"sqlite://{gateway.db}", gateway.signer).ok


def test_stream_gets_incremental_hmac_over_the_relayed_bytes(gateway: Gateway) -> None:
    with gateway.client(KEY_A) as client:
        with client.chat.completions.with_streaming_response.create(
            model="llama-3.1-8b", max_tokens=16, stream=True,
            messages=[{"role": "user", "content": PROMPT}],
        ) as resp:
            request_id = resp.headers["x-request-id"]
            received = b"".join(resp.iter_bytes())
    assert received.rstrip().endswith(b"data: [DONE]")
    recs = gateway.records(request_id)
    assert recs["request.started"]["request_content_hmac"] == independent_hmac(
        gateway.pseudo_key, gateway.sent[-1])
    assert recs["request.completed"]["response_content_hmac"] == independent_hmac(
        gateway.pseudo_key, received)
    assert PROMPT.encode() not in gateway.db_bytes()


def test_rule_without_opt_in_stores_no_content_and_no_hmac(gateway: Gateway) -> None:
    with gateway.client(KEY_B) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="other-model", max_tokens=8,
            messages=[{"role": "user", "content": PROMPT}],
        )
    recs = gateway.records(raw.http_response.headers["x-request-id"])
    assert recs["request.started"]["policy_rule"] == "everyone-else"
    for rec in recs.values():
        assert not {"request_content_hmac", "response_content_hmac"} & set(rec)
    assert b"content_hmac" not in gateway.db_bytes()
    assert PROMPT.encode() not in gateway.db_bytes()


def test_tampered_prompt_byte_gives_a_different_hmac(gateway: Gateway) -> None:
    with gateway.client(KEY_A) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="llama-3.1-8b", max_tokens=4,
            messages=[{"role": "user", "content": PROMPT}],
        )
    got = gateway.records(raw.http_response.headers["x-request-id"])["request.started"]
    sent = gateway.sent[-1]
    flipped = sent.replace(b"7731", b"7732")
    assert flipped != sent
    assert got["request_content_hmac"] != independent_hmac(gateway.pseudo_key, flipped)


def test_incremental_hasher_equals_one_shot_digest() -> None:
    pseudo = Pseudonymizer(b"k" * 32)
    data = b"data: {\"x\": 1}\n\n" * 50
    hasher = pseudo.content_hasher()
    for i in range(0, len(data), 7):
        hasher.update(data[i:i + 7])
    assert hasher.digest() == pseudo.content_digest(data)
    assert pseudo.content_digest(b"10.0.0.1") != pseudo.pseudonymize("10.0.0.1", "client")
    assert "k" * 8 not in repr(hasher)


BASE_POLICY = """\
version: 1
data_classes: [internal]
destinations:
  - {id: d1, host: 10.0.0.1, port: 8000, region: r1, jurisdiction: EU, operator: o}
rules:
  - id: r
"""


def test_opt_in_is_part_of_the_policy_revision_but_the_default_is_not() -> None:
    plain = Policy.from_text(BASE_POLICY)
    explicit_off = Policy.from_text(BASE_POLICY + "    audit: {content_hmac: false}\n")
    opted_in = Policy.from_text(BASE_POLICY + "    audit: {content_hmac: true}\n")
    assert plain.revision == explicit_off.revision
    assert opted_in.revision != plain.revision
    principal = PolicyPrincipal("k")
    assert opted_in.evaluate(principal, "internal", "d1").content_hmac is True
    assert plain.evaluate(principal, "internal", "d1").content_hmac is False
    assert opted_in.select(principal, "internal", ["d1"]).content_hmac is True


def test_deny_rule_never_opts_in_and_unknown_audit_keys_are_refused() -> None:
    denied = Policy.from_text(BASE_POLICY.replace("  - id: r\n", "  - id: r\n    effect: deny\n")
                              + "    audit: {content_hmac: true}\n")
    sel = denied.select(PolicyPrincipal("k"), "internal", ["d1"])
    assert sel.allowed == () and sel.content_hmac is False
    with pytest.raises(PolicyError) as info:
        Policy.from_text(BASE_POLICY + "    audit: {content_text: true}\n")
    assert "content_text" in str(info.value)
    with pytest.raises(PolicyError):
        Policy.from_text(BASE_POLICY + "    audit: {content_hmac: 'yes'}\n")
