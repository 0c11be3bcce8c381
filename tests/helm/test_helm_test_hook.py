"""The ``helm test`` hook really checks /readyz and /v1/models.

The hook pod runs a Python script (the gateway image has no shell). The test takes that script
from the rendered Pod, points it at a real uvicorn server on loopback that plays the gateway,
and runs it: it must pass against a healthy gateway and fail, with a message, against a gateway
that is not ready or that answers an anonymous /v1/models call.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sg_helm as h

from tests.asgi_lifespan import run_lifespan

KEY = "sk-helm-test-0123456789"


@dataclass
class FakeGateway:
    """ASGI app answering like the gateway; records the requests it saw."""

    ready: bool = True
    auth_required: bool = True
    seen: list[tuple[str, str | None]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        if scope["type"] == "lifespan":
            await run_lifespan(receive, send)
            return
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization")
        self.seen.append((scope["path"], auth.decode() if auth else None))
        body: dict[str, Any]
        if scope["path"] == "/readyz":
            status, body = (200, {"status": "ready"}) if self.ready else (503, {"status": "no"})
        elif scope["path"] == "/v1/models":
            if self.auth_required and auth != f"Bearer {KEY}".encode():
                status, body = 401, {"error": {"message": "missing key", "code": "auth"}}
            else:
                status, body = 200, {"object": "list", "data": [{"id": "llama-3.1-8b"}]}
        else:
            status, body = 404, {}
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})


def _hook_script(values: Path, base_url: str, key_dir: Path) -> str:
    objs = h.render(values)
    pod = h.one(objs, "Pod", "sg-sovereign-gateway-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python", "-c"]
    script: str = container["args"][0]
    assert 'base = "http://sg-sovereign-gateway:80"' in script
    script = script.replace("http://sg-sovereign-gateway:80", base_url)
    return script.replace("/etc/sovereign-gateway-test", str(key_dir))


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)


def test_hook_passes_against_a_healthy_gateway(serve_asgi: Any, tmp_path: Path) -> None:
    gw = FakeGateway()
    server = serve_asgi(gw)
    proc = _run(_hook_script(h.SCENARIOS["default"], server.url, tmp_path / "none"))
    assert proc.returncode == 0, proc.stderr
    assert "GET /readyz -> 200" in proc.stdout
    assert "GET /v1/models without a key -> 401" in proc.stdout
    assert gw.seen == [("/readyz", None), ("/v1/models", None)]


@pytest.mark.parametrize(("ready", "auth", "message"), [
    (False, True, "gateway not ready"),
    (True, False, "answered an anonymous call with 200, expected 401"),
])
def test_hook_fails_against_a_broken_gateway(
        serve_asgi: Any, tmp_path: Path, ready: bool, auth: bool, message: str) -> None:
    server = serve_asgi(FakeGateway(ready=ready, auth_required=auth))
    proc = _run(_hook_script(h.SCENARIOS["default"], server.url, tmp_path / "none"))
    assert proc.returncode == 1
    assert message in proc.stderr


def test_hook_lists_models_with_the_test_key(serve_asgi: Any, tmp_path: Path) -> None:
    gw = FakeGateway()
    server = serve_asgi(gw)
    key_dir = tmp_path / "key"
    key_dir.mkdir()
    (key_dir / "api-key").write_text(KEY + "\n", encoding="utf-8")
    proc = _run(_hook_script(h.SCENARIOS["postgres-ha"], server.url, key_dir))
    assert proc.returncode == 0, proc.stderr
    assert "models: llama-3.1-8b" in proc.stdout
    assert gw.seen[-1] == ("/v1/models", f"Bearer {KEY}")
    (key_dir / "api-key").write_text("wrong\n", encoding="utf-8")
    proc = _run(_hook_script(h.SCENARIOS["postgres-ha"], server.url, key_dir))
    assert proc.returncode == 1
    assert "listing models with the test key failed" in proc.stderr
