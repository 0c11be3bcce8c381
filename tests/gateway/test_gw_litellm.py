"""A replica of kind ``litellm`` in a real ``gateway serve`` with the egress guard enforcing.

litellm is imported by ``gateway serve`` only because such a replica is configured, after the
guard; it reaches the simulator through the policy-checked httpx client. The official openai SDK
gets a normal answer and a normal stream; nothing is blocked (litellm's hidden egress is off);
the audit log records the routing decision. (Subprocess: importing litellm changes global
state, so it never happens in the test process.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from gateway.audit import Signer, generate_key_file, write_key_pair
from tests.conftest import free_port
from tests.gateway.helpers import KEY_A, audit_export, config, start_sim

ROOT = Path(__file__).parents[2]


def test_litellm_replica_under_the_guard(serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    sim = start_sim(serve_asgi, models=["m"])
    port = free_port()
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(
        "version: 1\ndata_classes: [internal]\ndestinations:\n"
        f"  - {{id: hosted, url: '{sim.url}', region: eu-de-1, jurisdiction: EU, "
        "operator: o}\nrules:\n  - {id: all, classes: [internal]}\n")
    cfg = config([sim.url], listen={"host": "127.0.0.1", "port": port})
    cfg["models"] = [{"name": "hosted-m", "replicas": [{
        "url": sim.url, "destination": "hosted", "kind": "litellm",
        "litellm_model": "openai/m"}]}]
    cfg["keys"] = [{**cfg["keys"][0], "models": ["hosted-m"], "data_class": "internal"}]
    cfg["policy"] = {"file": str(pfile), "guard": "enforce"}
    key, _ = write_key_pair(Signer.generate(), tmp_path / "audit.key")
    db = tmp_path / "audit.db"
    cfg["audit"] = {"store": f"sqlite://{db}", "signing_key_file": str(key),
                    "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudo.key"))}
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LITELLM")}
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg_file)]
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE) as proc:
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(url + "/healthz", timeout=1).raise_for_status()
                    break
                except httpx.HTTPError:
                    assert proc.poll() is None and time.monotonic() < deadline
                    time.sleep(0.1)
            client = openai.OpenAI(base_url=url + "/v1", api_key=KEY_A, max_retries=0,
                                   timeout=30)
            resp = client.chat.completions.create(
                model="hosted-m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            assert resp.choices[0].message.content
            assert resp.usage is not None and resp.usage.completion_tokens > 0
            chunks = list(client.chat.completions.create(
                model="hosted-m", messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                stream=True, stream_options={"include_usage": True}))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text
            assert chunks[-1].usage is not None
            r = httpx.post(url + "/v1/embeddings", json={"model": "hosted-m", "input": "x"},
                           headers={"authorization": f"Bearer {KEY_A}"}, timeout=10)
            assert r.status_code == 400
            assert r.json()["error"]["code"] == "unsupported_endpoint"
            assert sim.stats()["received"] == 2
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    log = err.decode()
    assert "egress blocked" not in log, log[-3000:]
    records = audit_export(f"sqlite://{db}")
    assert [r for r in records if r["type"] == "egress.denied"] == []
    started = [r["data"] for r in records if r["type"] == "request.started"]
    assert len(started) == 3  # the embeddings request was refused by the litellm backend
    assert {s["destination"] for s in started} == {"hosted"}
    assert {s["policy_rule"] for s in started} == {"all"}
