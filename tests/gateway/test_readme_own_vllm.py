"""README "Point it at your own vLLM", walked as printed on loopback.

The section's commands and its gateway.yaml are taken from the README itself; only the
addresses are moved to loopback (10.0.0.11:8000 and 10.0.0.12:8000, in the copied policy.yaml
only, become two vLLM simulators, the example's port 8080 a free port). Before: the pasted
config required ``VLLM_KEY`` for a vLLM without a key, the client's ``base_url``
(``http://gateway:8080``) could not reach the example's 127.0.0.1 listener, the audit keys
were made in the checkout root and not ignored by git, nothing said how to start or check a
backend, and each replica URL had to be changed in two files (gateway.yaml and policy.yaml):
now only policy.yaml is edited. The section ended at serving: it now ends by verifying the
audit log that the request went into.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.conftest import default_signals, free_port, wait_until
from tests.gateway.helpers import start_sim

ROOT = Path(__file__).resolve().parents[2]


def _section() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("## Point it at your own vLLM", 1)[1].split("\n## ", 1)[0]


def _blocks(section: str, lang: str) -> list[str]:
    return [re.sub(r"^   ", "", b, flags=re.M)
            for b in re.findall(rf"```{lang}\n(.*?)```", section, re.S)]


def _commands(block: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in block.replace("\\\n", " ").splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_the_section_says_how_to_start_and_check_a_backend() -> None:
    section = _section()
    assert "vllm serve" in section and "/health" in section and "vllm-sim --port 8000" in section


def test_the_simulator_command_serves_the_model_the_config_names() -> None:
    """The no-GPU path as printed: the simulator must serve the ``served_model_name`` of the
    step's config, or the first request is a 404 from the replica (a new operator's walk
    found the printed ``vllm-sim --port 8000`` serving ``sim-model``)."""
    section = _section()
    printed = re.search(r"`(vllm-sim [^`]+)`", section).group(1)  # type: ignore[union-attr]
    (config,) = _blocks(section, "yaml")
    served = re.search(r"served_model_name:\s*(\S+)", config).group(1)  # type: ignore[union-attr]
    port = free_port()
    argv = [a if a != "8000" else str(port) for a in shlex.split(printed)[1:]]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-c", "from vllm_sim.cli import main; main()", *argv]
    with subprocess.Popen(default_signals(cmd), env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            def up() -> bool:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(up, 60, "the simulator to be up")
            models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()
            assert served in [m["id"] for m in models["data"]], models
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)


def test_the_audit_keys_are_made_outside_the_checkout_and_ignored_by_git(tmp_path: Path) -> None:
    cmds = [c for b in _blocks(_section(), "sh") for c in _commands(b)]
    keygen = cmds.index(next(c for c in cmds if c.startswith("gateway audit keygen")))
    assert any(c.startswith(("mkdir", "cd")) and "cd " in c for c in cmds[:keygen])
    for name in ("audit.key", "pseudonym.key", "model.pem"):
        ignored = subprocess.run(["git", "check-ignore", "-q", name], cwd=ROOT, check=False)
        assert ignored.returncode == 0, f"{name} is not ignored by git"


def test_walk_the_section_on_loopback(tmp_path: Path, serve_asgi: Callable[..., Any]) -> None:
    section = _section()
    sims = [start_sim(serve_asgi), start_sim(serve_asgi)]
    port = free_port()
    # The operator's edits: the replicas' addresses in policy.yaml only (step 2), the port.
    replicas = {"http://10.0.0.11:8000": sims[0].url, "http://10.0.0.12:8000": sims[1].url}
    moves = {"127.0.0.1:8080": f"127.0.0.1:{port}", "port: 8080": f"port: {port}"}

    def moved(text: str, edits: dict[str, str] = moves) -> str:
        for old, new in edits.items():
            text = text.replace(old, new)
        return text

    env = {k: v for k, v in os.environ.items() if k != "VLLM_KEY"}  # a vLLM without a key
    env["PYTHONPATH"] = str(ROOT)
    work = tmp_path / "site"
    work.mkdir()

    def gateway(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway.cli", *argv], cwd=work, env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    cmds = [c for b in _blocks(section, "sh") for c in _commands(b)]
    new = gateway(shlex.split(next(c for c in cmds if c.startswith("gateway keys new")))[1:])
    assert new.returncode == 0, new.stderr
    key = re.search(r"key:\s+(\S+)", new.stdout).group(1)  # type: ignore[union-attr]
    digest = re.search(r"sha256: ([0-9a-f]{64})", new.stdout).group(1)  # type: ignore[union-attr]
    (work / "policy.yaml").write_text(moved((ROOT / "examples" / "policy.yaml").read_text(),
                                            replicas))
    keygen = gateway(shlex.split(next(c for c in cmds
                                      if c.startswith("gateway audit keygen")))[1:])
    assert keygen.returncode == 0, keygen.stderr
    (config,) = _blocks(section, "yaml")
    assert not any(url in config for url in replicas), "a replica URL written twice"
    (work / "gateway.yaml").write_text(moved(config).replace("<hex>", digest))
    check = next(c for c in cmds if c.startswith("gateway check-config"))
    assert "VLLM_KEY" not in check
    res = gateway(shlex.split(check)[1:])
    assert res.returncode == 0, res.stdout + res.stderr
    serve = shlex.split(next(c for c in cmds if c.startswith("gateway serve")))[1:]
    with subprocess.Popen(default_signals([sys.executable, "-m", "gateway.cli", *serve]),
                          cwd=work, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True) as proc:
        try:
            def ready() -> bool:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
                except httpx.HTTPError:
                    return False

            wait_until(ready, 60, "the gateway to be ready")
            base_url = re.search(r'base_url="([^"]+)"', section).group(1)  # type: ignore[union-attr]
            with openai.OpenAI(base_url=moved(base_url), api_key=key, max_retries=0) as client:
                r = client.chat.completions.create(
                    model="llama-3.1-8b", messages=[{"role": "user", "content": "Hello!"}])
            assert r.choices[0].message.content
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    # Step 6: the request is in the log, and the signatures were checked (not skipped).
    verify = gateway(shlex.split(next(c for c in cmds if c.startswith("gateway audit verify")))[1:])
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "OK: no tampering found" in verify.stdout
    assert "signatures_not_checked" not in verify.stdout + verify.stderr
    tail = gateway(shlex.split(next(c for c in cmds if c.startswith("gateway audit tail")))[1:])
    assert tail.returncode == 0, tail.stderr
    assert "request.completed" in tail.stdout and "outcome=ok" in tail.stdout, tail.stdout
