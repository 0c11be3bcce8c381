"""A replica the process egress guard blocks answers the documented ``upstream_egress_denied``.

A replica URL whose DNS name resolves outside its destination's ``resolves_to`` is refused by
the guard inside ``socket.connect``/``getaddrinfo``: its ``EgressBlocked`` is also an
``OSError`` (for the standard library's clean-up), and the relay's client turned it into a
``ConnectFailed``: a 502 ``upstream_connect_error``, while docs/policy.md promises
``upstream_egress_denied``. Real ``gateway serve`` (subprocess, guard ``enforce``), a vLLM
simulator on loopback, the official openai SDK.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from tests.conftest import free_port
from tests.gateway.egress_testdata import KEYS, gateway_config
from tests.gateway.test_gw_egress_serve import _wait_ready
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

ROOT = Path(__file__).parents[2]


def test_replica_resolving_outside_resolves_to_is_upstream_egress_denied(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(yaml.safe_dump({
        "version": 1, "data_classes": ["public", "internal", "confidential"],
        "destinations": [{"id": "d", "url": f"http://localhost:{sim.port}",
                          "resolves_to": ["10.0.0.0/8"], "region": "eu-de-1",
                          "jurisdiction": "EU", "operator": "acme"}],
        "rules": [{"id": "all", "classes": ["public", "internal", "confidential"]}]}))
    port = free_port()
    urls = {n: sim.url for n in ("us", "eu-a", "eu-b")}
    cfg = gateway_config(urls, pfile, guard="enforce", port=port)
    cfg["models"] = [{"name": "m", "replicas": [
        {"url": f"http://localhost:{sim.port}", "destination": "d"}]}]
    cfg["retries"] = {"max_attempts": 1}
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg_file)]
    with subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE) as proc:
        try:
            _wait_ready(url, proc)
            client = openai.OpenAI(base_url=url + "/v1", api_key=KEYS["pub"], max_retries=0,
                                   timeout=20)
            with pytest.raises(openai.APIStatusError) as info:
                client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=20)
    assert info.value.status_code == 502, stderr.decode()[-2000:]
    assert info.value.body["code"] == "upstream_egress_denied"  # type: ignore[index]
    assert sim.app.state.received == 0 if hasattr(sim, "app") else True
