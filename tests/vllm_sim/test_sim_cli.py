"""The ``vllm-sim`` console script."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

VLLM_SIM = Path(sys.executable).with_name("vllm-sim")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_cli_serves_configured_models() -> None:
    port = _port()
    proc = subprocess.Popen(
        [str(VLLM_SIM), "--port", str(port), "--model", "a", "--model", "b", "--tokens", "4",
         "--max-model-len", "64", "--ttft-ms", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health").raise_for_status()
                break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline
                time.sleep(0.05)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        assert [m.id for m in client.models.list().data] == ["a", "b"]
        resp = client.completions.create(model="b", prompt="hi")
        assert resp.usage is not None and resp.usage.completion_tokens == 4
        extra = client.models.list().data[0].model_extra or {}
        assert (extra["root"], extra["max_model_len"]) == ("a", 64)
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()
    # uvicorn shuts down gracefully, then re-raises the signal it caught: the shared CLI shell
    # exits 128 + SIGTERM (a stopped simulator is not a success)
    assert proc.returncode == 128 + signal.SIGTERM


def test_cli_rejects_bad_options() -> None:
    res = subprocess.run([str(VLLM_SIM), "--tokens", "0"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2
    assert "tokens_per_response" in res.stderr
    res = subprocess.run([str(VLLM_SIM), "--no-such-flag"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2


def test_cli_says_once_where_it_listens_on_stderr() -> None:
    """At the default log level uvicorn printed nothing once it listened: a new operator could
    not tell the simulator was up. One line on standard error names the address (the port
    chosen for ``--port 0``), the served model and the profile; standard output stays empty."""
    import re
    import select

    proc = subprocess.Popen(
        [str(VLLM_SIM), "--port", "0", "--model", "llama-3.1-8b", "--profile",
         "llama-3.1-8b-h100"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None and proc.stdout is not None
    try:
        ready, _, _ = select.select([proc.stderr], [], [], 30)
        assert ready, "no line on stderr within 30 s"
        line = proc.stderr.readline().decode()
        match = re.fullmatch(r"vllm-sim: listening on (http://127\.0\.0\.1:(\d+)) \(simulator, "
                             r"not a real vLLM\): model llama-3\.1-8b, profile "
                             r"llama-3\.1-8b-h100; Ctrl-C stops it\n", line)
        assert match, line
        assert int(match.group(2)) != 0
        # The address printed is the one that answers.
        assert httpx.get(f"{match.group(1)}/health", timeout=10).status_code == 200
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert out == b"", out
    assert proc.returncode == 128 + signal.SIGTERM, err


def test_help_names_the_default_model() -> None:
    """Started without ``--model`` the simulator serves ``sim-model``; a gateway replica whose
    ``served_model_name`` is another name gets a 404 from it. The help did not say so."""
    out = subprocess.run([sys.executable, "-m", "vllm_sim.cli", "--help"], capture_output=True,
                         text=True, timeout=60, check=True,
                         env={"PYTHONPATH": str(Path(__file__).resolve().parents[2]),
                              "COLUMNS": "80", "PATH": "/usr/bin:/bin"}).stdout
    assert "None given: sim-model" in " ".join(out.split()), out
