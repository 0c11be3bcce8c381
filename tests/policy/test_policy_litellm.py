"""litellm under the process guard: importing it and calling it opens no connection but to the
allowed destination. Runs litellm in a subprocess (its import changes global state).

The server is the vLLM simulator (a real ASGI app on a real uvicorn on loopback).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from policy import LITELLM_OFFLINE_ENV, litellm_env
from vllm_sim import SimConfig, create_app

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """\
    import asyncio, json, socket, sys
    from policy import EgressGuard, Policy, import_litellm

    url, provoke_port, use_helper = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    policy = Policy.from_text(
        "version: 1\\ndata_classes: [public]\\ndestinations:\\n"
        f"  - {{id: sim, url: '{url}', region: lo, jurisdiction: EU, operator: test}}\\n"
        "rules:\\n  - id: all\\n"
    )
    events = []
    guard = EgressGuard(policy, on_event=lambda e: events.append(e.as_record())).install()
    guard.self_test(("127.0.0.1", provoke_port))
    if use_helper:
        litellm = import_litellm()
    else:
        import litellm

    async def complete() -> str:
        resp = await litellm.acompletion(
            model="openai/sim-model", api_base=url + "/v1", api_key="sk-local",
            messages=[{"role": "user", "content": "hello"}], max_tokens=8,
        )
        return resp.choices[0].message.content

    content = asyncio.run(complete())

    # Transport layer too: litellm's OpenAI-compatible provider over the policy httpx client.
    # The hostname is known to the transport's policy only; if litellm bypassed the client, the
    # guard would block (and record) its lookup of sim.internal before any DNS query.
    import openai
    from policy import make_httpx_client
    transport_policy = Policy.from_text(
        "version: 1\\ndata_classes: [public]\\ndestinations:\\n"
        f"  - {{id: sim, host: sim.internal, port: {url.rsplit(':', 1)[1]}, region: lo,"
        " jurisdiction: EU, operator: test, resolves_to: [127.0.0.0/8]}\\n"
    )
    resolved = []

    def resolver(host, port):
        resolved.append(host)
        return ["127.0.0.1"]

    async def complete_via_policy_client() -> str:
        http = make_httpx_client(transport_policy, resolver=resolver)
        name_url = "http://sim.internal:" + url.rsplit(":", 1)[1] + "/v1"
        client = openai.AsyncOpenAI(base_url=name_url, api_key="sk-local", http_client=http)
        resp = await litellm.acompletion(
            model="openai/sim-model", api_base=name_url, api_key="sk-local", client=client,
            messages=[{"role": "user", "content": "hello"}], max_tokens=8,
        )
        await client.close()
        return resp.choices[0].message.content

    via_client = asyncio.run(complete_via_policy_client())
    try:
        socket.create_connection(("127.0.0.1", provoke_port), timeout=1)
        provoked = "connected"
    except Exception as exc:
        provoked = type(exc).__name__
    print("RESULT " + json.dumps({"content": content, "events": events, "provoked": provoked,
                                  "via_client": via_client, "resolved": resolved}))
    """
)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(url: str, provoke_port: int, *, use_helper: bool, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, url, str(provoke_port), "1" if use_helper else "0"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


def _clean_env() -> dict[str, str]:
    """The environment without any of the offline switches (as a fresh operator shell)."""
    env = {k: v for k, v in os.environ.items()
           if k not in LITELLM_OFFLINE_ENV and not k.startswith("LITELLM_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_litellm_env_sets_every_switch() -> None:
    env: dict[str, str] = {"LITELLM_LOCAL_MODEL_COST_MAP": "False", "PATH": "/bin"}
    changed = litellm_env(env)
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and env["PATH"] == "/bin"
    assert changed == dict(LITELLM_OFFLINE_ENV)
    assert litellm_env(env) == {}


@pytest.mark.slow
def test_litellm_completion_opens_no_other_connection(serve_asgi: Callable[..., Any]) -> None:
    srv = serve_asgi(create_app(SimConfig(models=["sim-model"])))
    provoke = _closed_port()
    result = _run(srv.url, provoke, use_helper=True, env=_clean_env())
    assert result["content"]  # the simulator answered through litellm
    assert result["via_client"] and result["resolved"] == ["sim.internal"]
    assert result["provoked"] == "EgressBlocked"
    # The only egress the guard refused is the one this test provoked.
    assert [(e["host"], e["port"], e["decision"]) for e in result["events"]] == [
        ("127.0.0.1", provoke, "deny")
    ]


@pytest.mark.slow
def test_without_the_switches_the_guard_catches_litellm_phoning_home(
    serve_asgi: Callable[..., Any],
) -> None:
    # Negative control: the same run without litellm_env() records litellm's own fetch (blocked
    # at the DNS lookup, so nothing leaves the machine). This is what the test above would see
    # if a switch were missing.
    srv = serve_asgi(create_app(SimConfig(models=["sim-model"])))
    result = _run(srv.url, _closed_port(), use_helper=False, env=_clean_env())
    assert result["content"]
    hosts = {e["host"] for e in result["events"] if e["event"] == "socket.getaddrinfo"}
    assert "raw.githubusercontent.com" in hosts
    assert all(e["decision"] == "deny" for e in result["events"])
