"""``make run``: the vLLM simulator and the gateway on loopback, with a demo key.

Starts ``vllm-sim`` as a subprocess on a free port, writes a config with a fresh demo key into a
temporary directory, prints a ``curl`` and an ``openai`` SDK example that work as printed, and
runs the gateway in the foreground. Ctrl-C stops both.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from gateway.auth import digest_key, new_key
from gateway.cli.serve import run
from gateway.settings import load

__all__ = ["main"]

MODEL = "llama-3.1-8b"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"


def _free_port(preferred: int) -> int:
    for port in (preferred, 0):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise RuntimeError("no free port on 127.0.0.1")


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm-sim exited with code {proc.returncode}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:  # noqa: S310
                if resp.status == 200:
                    return
        time.sleep(0.1)
    raise RuntimeError(f"vllm-sim did not become ready at {url}")


def examples(base_url: str, key: str) -> str:
    """The curl and openai SDK snippets printed by the demo."""
    return f"""
=== sovereign-gateway demo ===
gateway  {base_url}   (model "{MODEL}", alias "default"; backend: vLLM simulator)
demo key {key}

curl:
  curl -sS {base_url}/v1/chat/completions \\
    -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
    -d '{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "Hello!"}}]}}'

  curl -sSN {base_url}/v1/chat/completions \\
    -H "Authorization: Bearer {key}" -H "Content-Type: application/json" \\
    -d '{{"model": "{MODEL}", "stream": true, "messages": [{{"role": "user", "content": "Hi"}}]}}'

openai SDK (python; paste into a shell in this checkout):
.venv/bin/python - <<'PY'
from openai import OpenAI
client = OpenAI(base_url="{base_url}/v1", api_key="{key}")
r = client.chat.completions.create(model="{MODEL}",
                                   messages=[{{"role": "user", "content": "Hello!"}}])
print(r.choices[0].message.content, r.usage)
for chunk in client.chat.completions.create(model="{MODEL}", stream=True,
                                            messages=[{{"role": "user", "content": "Hi"}}]):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
PY

Press Ctrl-C to stop the gateway and the simulator.
"""


def main() -> int:
    """Run the demo until Ctrl-C; returns the exit code."""
    sim_port = _free_port(8001)
    gw_port = _free_port(8080)
    sim_url = f"http://127.0.0.1:{sim_port}"
    sim = subprocess.Popen(
        [
            sys.executable, "-c", "import sys; from vllm_sim.cli import main; sys.exit(main())",
            "--host", "127.0.0.1", "--port", str(sim_port), "--model", SERVED,
            "--ttft-ms", "50", "--itl-ms", "20",
        ],
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"},
    )
    try:
        _wait_ready(sim_url, sim)
        key = new_key()
        config = {
            "listen": {"host": "127.0.0.1", "port": gw_port},
            "models": [
                {
                    "name": MODEL,
                    "aliases": ["default"],
                    "served_model_name": SERVED,
                    "replicas": [{"url": sim_url}],
                }
            ],
            "keys": [{"id": "demo", "sha256": digest_key(key).hex(), "models": [MODEL],
                      "team": "demo"}],
            "logging": {"format": "text"},
        }
        with tempfile.TemporaryDirectory(prefix="sg-demo-") as tmp:
            path = Path(tmp) / "gateway.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
            settings = load(path, os.environ)
            print(f"config written to {path} (removed on exit)")
            print(examples(f"http://127.0.0.1:{gw_port}", key), flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                run(settings)
    finally:
        sim.terminate()
        try:
            sim.wait(timeout=5)
        except subprocess.TimeoutExpired:
            sim.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
