"""The built image (``$SG_IMAGE``, ``make image``) serves ``/healthz`` and chat completions.

The container runs the way the Helm chart runs it: root filesystem read-only, UID/GID 10001,
the no-phone-home environment, the config mounted read-only. It uses the host's network
(podman ``--network host``, runtime ``runc``) so that it reaches a vLLM simulator on loopback;
the official openai SDK talks to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.conftest import free_port
from tests.gateway.helpers import SERVED, start_sim

pytestmark = pytest.mark.image

PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
KEY = "sg-image-test-key"
NO_PHONE_HOME = {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1", "DO_NOT_TRACK": "1",
                 "VLLM_NO_USAGE_STATS": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def _podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([*PODMAN, *args], capture_output=True, text=True, check=False,
                         timeout=120)
    if check and res.returncode != 0:
        raise AssertionError(f"podman {args[0]} exited {res.returncode}: {res.stderr[-2000:]}")
    return res


@pytest.fixture
def container(serve_asgi: Callable[..., Any], tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Start the image against a simulator; yields its URL and ``podman inspect`` document."""
    sim = start_sim(serve_asgi)
    port = free_port()
    cfg = {
        "listen": {"host": "127.0.0.1", "port": port},
        "models": [{"name": "m", "served_model_name": SERVED,
                    "replicas": [{"url": sim.url}]}],
        "keys": [{"id": "image-test", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                  "models": ["m"]}],
        "health": {"active": False},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "config.yaml").chmod(0o644)
    name = f"sg-image-test-{secrets.token_hex(4)}"
    env = [arg for k, v in NO_PHONE_HOME.items() for arg in ("--env", f"{k}={v}")]
    # podman's default RLIMIT_NOFILE (1 Mi) is above this machine's hard limit and runc may not
    # raise it (EPERM at container init): ask for what the host allows
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limits = ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", "nproc=4096:4096"]
    url = f"http://127.0.0.1:{port}"
    try:  # a failed `run` may leave a created container behind: removed in `finally` too
        _podman("run", "--detach", "--name", name, "--read-only", "--user", "10001:10001",
                "--network", "host", "--security-opt", "no-new-privileges", *limits, *env,
                "--volume", f"{tmp_path / 'config.yaml'}:/etc/sovereign-gateway/config.yaml:ro",
                os.environ["SG_IMAGE"])
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            state = json.loads(_podman("inspect", name).stdout)[0]["State"]
            if not state["Running"] or time.monotonic() > deadline:
                raise AssertionError(f"container not serving ({state['Status']}): "
                                     + _podman("logs", name, check=False).stderr[-3000:])
            time.sleep(0.2)
        yield {"url": url, "inspect": json.loads(_podman("inspect", name).stdout)[0],
               "name": name}
    finally:
        _podman("rm", "--force", "--time", "5", name, check=False)


def test_image_serves_healthz_and_chat_read_only_as_10001(container: dict[str, Any]) -> None:
    cfg = container["inspect"]
    assert cfg["HostConfig"]["ReadonlyRootfs"] is True
    assert cfg["Config"]["User"] == "10001:10001"
    env = dict(e.split("=", 1) for e in cfg["Config"]["Env"])
    assert {k: env.get(k) for k in NO_PHONE_HOME} == NO_PHONE_HOME

    health = httpx.get(container["url"] + "/healthz", timeout=5)
    assert health.status_code == 200

    client = openai.OpenAI(base_url=container["url"] + "/v1", api_key=KEY, max_retries=0,
                           timeout=30)
    resp = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert resp.choices[0].message.content
    assert resp.usage is not None and resp.usage.completion_tokens == 5
    chunks = list(client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=container["url"] + "/v1", api_key="wrong", max_retries=0,
                      timeout=30).models.list()

    # the process really runs as 10001 and cannot write its root filesystem
    top = _podman("top", container["name"], "huser", "args").stdout
    assert "gateway" in top and " root " not in f" {top} ", top
    probe = ("import os\nprint(os.getuid(), os.getgid())\n"
             "try:\n    open('/app/written', 'w')\nexcept OSError as e:\n    print(e.errno)\n")
    out = _podman("exec", container["name"], "/app/.venv/bin/python", "-c", probe).stdout
    assert out.split() == ["10001", "10001", "30"]  # EROFS: read-only file system
