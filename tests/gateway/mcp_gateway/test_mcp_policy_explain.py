"""``policy explain --mcp-server S --tool T``: may key K call tool T on server S with its class."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.gateway.mcp_gateway.harness import ROOT, policy_text


def explain(tmp_path: Path, key: str, tool: str | None, *extra: str) -> tuple[int, dict[str, Any]]:
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(policy_text({"model": 9001, "tools-search": 9100}))
    cfg = {
        "models": [{"name": "m", "replicas": [{"url": "http://127.0.0.1:9001",
                                               "destination": "model"}]}],
        "keys": [{"id": "k-agent", "sha256": "0" * 64, "team": "agents",
                  "data_class": "internal"},
                 {"id": "k-secret", "sha256": "1" * 64, "team": "agents",
                  "data_class": "secret"}],
        "mcp": {"servers": [{"name": "search", "url": "http://127.0.0.1:9100/mcp",
                             "destination": "tools-search"}],
                "access": [{"teams": ["agents"], "allow": ["*"], "deny": ["delete_*"],
                            "prompts": {"allow": ["summarise"]},
                            "resources": {"allow": ["docs://public/*"],
                                          "deny": ["docs://public/private-*"]}}]},
        "policy": {"file": "policy.yaml"},  # explain speaks for a gateway that enforces it
    }
    cfile = tmp_path / "gateway.yaml"
    cfile.write_text(yaml.safe_dump(cfg))
    res = subprocess.run(
        [sys.executable, "-m", "policy.cli", "explain", str(pfile), "--key", key,
         "--config", str(cfile), "--mcp-server", "search",
         *(["--tool", tool] if tool is not None else []), "--json", *extra],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return res.returncode, json.loads(res.stdout)


def test_explain_answers_for_key_tool_server_and_class(tmp_path: Path) -> None:
    code, doc = explain(tmp_path, "k-agent", "fetch")
    assert code == 0 and doc["mcp"]["allowed"] and doc["allowed"] == ["tools-search"]
    code, doc = explain(tmp_path, "k-agent", "delete_all")
    assert code == 1 and doc["mcp"] == {"server": "search", "tool": "delete_all",
                                        "allowed": False, "reason": "access[0] denies 'delete_*'"}
    code, doc = explain(tmp_path, "k-secret", "fetch")  # the class may not go there
    assert code == 1 and doc["mcp"]["allowed"] and doc["allowed"] == []
    assert doc["data_class"] == "secret"


def test_explain_answers_for_prompts_and_resources_as_the_gateway_decides(
        tmp_path: Path) -> None:
    """The same ``mcp.access`` rules the gateway applies to ``prompts/get`` and
    ``resources/read`` (policy.check_access), asked by name or URI."""
    code, doc = explain(tmp_path, "k-agent", None, "--prompt", "summarise")
    assert code == 0 and doc["mcp"]["prompt"] == "summarise" and doc["mcp"]["allowed"]
    code, doc = explain(tmp_path, "k-agent", None, "--prompt", "leak_everything")
    assert code == 1 and not doc["mcp"]["allowed"]
    code, doc = explain(tmp_path, "k-agent", None, "--resource", "docs://public/a.md")
    assert code == 0 and doc["mcp"]["allowed"]
    code, doc = explain(tmp_path, "k-agent", None, "--resource", "docs://public/private-x")
    assert code == 1 and not doc["mcp"]["allowed"] and "denies" in doc["mcp"]["reason"]
    both = subprocess.run(
        [sys.executable, "-m", "policy.cli", "explain", str(tmp_path / "policy.yaml"),
         "--key", "k-agent", "--config", str(tmp_path / "gateway.yaml"), "--mcp-server",
         "search", "--tool", "fetch", "--prompt", "summarise"],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert both.returncode == 2 and "one of --tool, --prompt and --resource" in both.stderr
