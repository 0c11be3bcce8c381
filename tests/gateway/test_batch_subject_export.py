"""A data-subject access request holds the subject's Batch API records (tester2 finding 5).

A bearer-JWT caller uploads batch input files, deletes one, and runs a batch; every
``batch.*`` record written for it (``batch.file_created`` of its uploads and of the output
file, ``batch.file_deleted``, ``batch.created``, ``batch.finished``) carries its ``identity``
(issuer, subject pseudonym, rule, ``kid``), as its request records do, so
``gateway audit export --subject <pseudonym>`` finds them; an API key's upload is in no
subject's export. Real parts: ``gateway serve`` on loopback with a SQLite audit chain
(tests/gateway/mcp_gateway/harness.py), the simulator as the replica, the official ``openai``
SDK, the ``gateway`` CLI.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.audit.pseudonym import load_pseudonymizer
from gateway.identity.auth import subject_pseudonym
from tests.gateway.identity.jwtkit import AUDIENCE, SigningKey, identity_section, write_jwks
from tests.gateway.mcp_gateway.harness import KEYS, ROOT, start_gateway
from tests.gateway.mcp_gateway.upstreams import Counting, sdk_server
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

LINES = b"".join(json.dumps({
    "custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
    "body": {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "q"}]},
}).encode() + b"\n" for i in range(2))


def _export(store: str, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "gateway.cli", "audit", "export", "--store",
                          store, *args], cwd=ROOT, capture_output=True, text=True, check=True,
                         timeout=60)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def test_the_subject_export_holds_its_batch_records(
        serve_asgi: Callable[..., Any], tmp_path: Path, request: pytest.FixtureRequest) -> None:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    servers = {"tools": serve_asgi(Counting(sdk_server())).url + "/mcp"}
    signer = SigningKey("rsa-1")
    jwks = tmp_path / "jwks.json"
    section = identity_section(jwks, write_jwks(jwks, signer))
    section["rules"][0].update(team="agents", models=["m"])
    section["accept"] = ["key", "jwt"]

    def cfg(c: dict[str, Any]) -> None:
        c["identity"] = section
        c["batch"] = {"database": str(tmp_path / "b.db"), "concurrency": 2}
        c["flow_control"] = {"enabled": True, "default_class": "interactive",
                             "classes": [{"name": "interactive"}, {"name": "batch"}]}

    gw = start_gateway(tmp_path, sim.url, servers, {}, None, cfg_extra=cfg)
    try:
        pseudo = load_pseudonymizer(Path(gw.cfg["audit"]["pseudonym_key_file"]))
        subject = subject_pseudonym(pseudo, section["issuers"][0]["issuer"],
                                    "alice@example.org")
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key=signer.token(aud=AUDIENCE),
                          max_retries=0)
        request.addfinalizer(c.close)
        spare = c.files.create(file=("spare.jsonl", io.BytesIO(LINES)), purpose="batch")
        c.files.delete(spare.id)
        f = c.files.create(file=("in.jsonl", io.BytesIO(LINES)), purpose="batch")
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                             completion_window="24h")
        deadline = time.monotonic() + 30
        while b.status not in ("completed", "failed") and time.monotonic() < deadline:
            time.sleep(0.2)
            b = c.batches.retrieve(b.id)
        assert b.status == "completed" and b.output_file_id is not None
        keyed = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEYS["agent"], max_retries=0)
        request.addfinalizer(keyed.close)
        other = keyed.files.create(file=("k.jsonl", io.BytesIO(LINES)), purpose="batch")
        for _ in range(100):  # batch.finished is written after the status is saved
            if any(r["type"] == "batch.finished" for r in gw.records()):
                break
            time.sleep(0.1)
    finally:
        gw.stop()
    store = f"sqlite://{gw.db}"
    exported = _export(store, "--subject", subject)
    batch = [(r["type"], r["data"].get("file_id") or r["data"].get("batch_id"))
             for r in exported if r["type"].startswith("batch.")]
    assert sorted(batch) == sorted([
        ("batch.file_created", spare.id), ("batch.file_deleted", spare.id),
        ("batch.file_created", f.id), ("batch.created", b.id),
        ("batch.file_created", b.output_file_id), ("batch.finished", b.id)])
    for r in exported:
        if r["type"].startswith("batch."):
            who = r["data"]["identity"]
            assert who["subject"] == subject and who["method"] == "jwt"
            assert who["issuer"] == section["issuers"][0]["issuer"] and who["kid"] == "rsa-1"
            assert r["data"]["key_id"] == "id:" + subject.rsplit(":", 1)[-1][:32]
    every = _export(store)
    keyed_upload = [r for r in every if r["type"] == "batch.file_created"
                    and r["data"]["file_id"] == other.id]
    assert len(keyed_upload) == 1 and "identity" not in keyed_upload[0]["data"]
