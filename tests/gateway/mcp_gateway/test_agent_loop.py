"""An agent loop through one door: the ``openai`` SDK asks the model (the simulator answers with
``tool_calls`` when the request has tools), the agent executes the call with the official MCP
SDK through the gateway's MCP endpoint, hands the result back to the model, and
``gateway audit timeline`` shows the model calls and the tool call as one session, linked by
the trace id of the agent's ``traceparent``."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import openai
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.gateway.mcp_gateway.harness import KEYS, ROOT


@asynccontextmanager
async def agent_mcp(url: str, key: str, traceparent: str) -> AsyncIterator[Client]:
    """The SDK client of the agent, sending its key and the session's traceparent."""
    headers = {"Authorization": f"Bearer {key}", "traceparent": traceparent}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            yield client


def test_agent_loop_model_and_tool_calls_share_one_audited_trace(stack: dict[str, Any]) -> None:
    gw = stack["gateway"]
    trace_id = secrets.token_hex(16)
    traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    model = openai.OpenAI(base_url=gw.url + "/v1", api_key=KEYS["agent"], max_retries=0,
                          timeout=30, default_headers={"traceparent": traceparent})

    async def loop() -> tuple[str, str, str]:
        async with agent_mcp(gw.mcp("tools"), KEYS["agent"], traceparent) as mcp:
            listed = await mcp.list_tools()
            tools: list[Any] = [
                {"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.input_schema}}
                for t in listed.tools]
            messages: list[Any] = [{"role": "user", "content": "Say it back to me."}]
            first = model.chat.completions.create(model="m", messages=messages, tools=tools)
            choice = first.choices[0]
            assert choice.finish_reason == "tool_calls"
            call = choice.message.tool_calls[0]  # type: ignore[index]
            arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
            result = await mcp.call_tool(call.function.name, arguments)  # type: ignore[union-attr]
            text = result.content[0].text  # type: ignore[union-attr]
            messages += [choice.message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": text}]
            final = model.chat.completions.create(model="m", messages=messages, tools=tools)
            return (call.function.name, text,  # type: ignore[union-attr]
                    final.choices[0].message.content or "")

    name, text, answer = anyio.run(loop)
    assert name == "echo" and text == "café 日本 🚀"  # the simulator's argument for a string
    assert answer  # the model answered in text once it had the tool's result
    res = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "audit", "timeline", "--store",
         f"sqlite://{gw.db}", "--trace-id", trace_id, "--json"],
        cwd=ROOT, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    steps = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(s["kind"], s["what"], s["decision"], s["status"]) for s in steps] == [
        ("model", "m", "allow", 200), ("tool", "tools/echo", "allow", 200),
        ("model", "m", "allow", 200)]
    assert {s["key_id"] for s in steps} == {"k-agent"}
    assert {s["trace_id"] for s in steps} == {trace_id}
    text_out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "audit", "timeline", "--store",
         f"sqlite://{gw.db}", "--trace-id", trace_id],
        cwd=ROOT, capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert "tool  k-agent tools/echo allow 200" in text_out
