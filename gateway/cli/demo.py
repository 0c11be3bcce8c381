"""``make run``: the vLLM simulator and the gateway on loopback, with a demo key.

Starts ``vllm-sim`` as a subprocess on a free port, writes a config with a fresh demo key into a
temporary directory, prints a ``curl`` and an ``openai`` SDK example that work as printed, and
runs the gateway in the foreground. Ctrl-C (SIGINT), SIGTERM or SIGHUP stop both and remove the
temporary directory; like uvicorn itself, a server stopped on request exits 0.

Shutdown is explicit because uvicorn, after its graceful shutdown, re-raises the signal it
caught: with SIGTERM's default disposition that would kill this process before any ``finally``
runs, leaving the simulator and the directory behind. Here every stop signal becomes a
:class:`Stopped` exception. The simulator runs in its own process group (a terminal's Ctrl-C
reaches only the demo, which then stops the simulator's whole group after the gateway has
drained) and, on Linux, gets SIGTERM if the demo dies without cleaning up (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import yaml

from gateway.auth import digest_key, new_key
from gateway.config.loader import load
from gateway.serving.run import run

__all__ = ["Stopped", "main"]

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


class Stopped(Exception):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) arrived; ``signum`` names it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, _frame: FrameType | None) -> None:
    raise Stopped(signum)


def _hang_up(_signum: int, _frame: FrameType | None) -> None:
    # uvicorn handles SIGINT and SIGTERM only: raising inside its event loop would skip the
    # graceful shutdown, so a hang-up is turned into the SIGTERM it shuts down on.
    signal.raise_signal(signal.SIGTERM)


@contextlib.contextmanager
def _stop_signals_raise() -> Iterator[None]:
    """Turn SIGTERM, SIGHUP (as SIGTERM) and, unless ignored (e.g. under ``nohup``), SIGINT
    into :class:`Stopped` while the demo runs; restore the previous handlers afterwards."""
    previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue
        previous[sig] = signal.signal(sig, _hang_up if sig == signal.SIGHUP else _raise_stopped)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _die_with_parent() -> list[str]:
    """The exec wrapper that gives the simulator SIGTERM when the demo dies (even by SIGKILL).

    util-linux ``setpriv --pdeathsig`` sets ``PR_SET_PDEATHSIG`` (prctl(2), Linux) and execs the
    command; without it (another OS, a minimal image) the simulator is still stopped by
    :func:`_stop_sim` on every orderly exit. An exec wrapper rather than ``preexec_fn``: Python
    code between ``fork`` and ``exec`` can deadlock in a process with threads.
    """
    setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
    return [setpriv, "--pdeathsig", "TERM"] if setpriv else []


def _start_sim(port: int, stopping: threading.Event) -> subprocess.Popen[bytes]:
    sim = subprocess.Popen(
        [
            *_die_with_parent(),
            sys.executable, "-c", "import sys; from vllm_sim.cli import main; sys.exit(main())",
            "--host", "127.0.0.1", "--port", str(port), "--model", SERVED,
            "--ttft-ms", "50", "--itl-ms", "20",
        ],
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"},
        process_group=0, stderr=subprocess.PIPE,
    )
    threading.Thread(target=_relay_stderr, args=(sim, stopping), name="vllm-sim-stderr",
                     daemon=True).start()
    return sim


_SIM_STOPPED = b"vllm-sim: error [interrupted]: interrupted by SIGTERM"


def _relay_stderr(sim: subprocess.Popen[bytes], stopping: threading.Event) -> None:
    """The simulator's standard error on ours, except the error line of the SIGTERM the demo
    sends it on the way out: after a Ctrl-C it read as a failure of the demo."""
    assert sim.stderr is not None
    with sim.stderr:
        for line in sim.stderr:
            if stopping.is_set() and line.startswith(_SIM_STOPPED):
                continue
            sys.stderr.buffer.write(line)
            sys.stderr.flush()


def _stop_sim(sim: subprocess.Popen[bytes], stopping: threading.Event,
              timeout_s: float = 5.0) -> None:
    """SIGTERM the simulator's process group, SIGKILL it after ``timeout_s`` seconds."""
    stopping.set()
    if sim.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sim.pid, signal.SIGTERM)
    try:
        sim.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sim.pid, signal.SIGKILL)
        sim.wait()


def _demo_config(gw_port: int, sim_url: str, key: str) -> dict[str, object]:
    return {
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
        # No load balancer in front of the demo to take it out of rotation first: Ctrl-C
        # stops accepting at once (requests in flight still finish, within drain.timeout_s).
        "drain": {"delay_s": 0},
    }


def main() -> int:
    """Run the demo until a stop signal.

    Returns:
        0: the gateway stopped (a stop signal is the demo's normal end, as for uvicorn).
    """
    with _stop_signals_raise():
        try:
            _run_demo()
        except Stopped as stop:
            print(f"stopped by {signal.Signals(stop.signum).name}: gateway and simulator "
                  "stopped, temporary directory removed", file=sys.stderr)
        except KeyboardInterrupt:  # SIGINT re-raised by uvicorn under an inherited handler
            pass
    return 0


def _run_demo() -> None:
    sim_port = _free_port(8001)
    gw_port = _free_port(8080)
    sim_url = f"http://127.0.0.1:{sim_port}"
    stopping = threading.Event()
    sim = _start_sim(sim_port, stopping)
    try:
        with tempfile.TemporaryDirectory(prefix="sg-demo-") as tmp:
            _wait_ready(sim_url, sim)
            key = new_key()
            path = Path(tmp) / "gateway.yaml"
            path.write_text(yaml.safe_dump(_demo_config(gw_port, sim_url, key), sort_keys=False),
                            encoding="utf-8")
            settings = load(path, os.environ)
            print(f"config written to {path} (removed on exit)")
            print(examples(f"http://127.0.0.1:{gw_port}", key), flush=True)
            run(settings)
    finally:
        _stop_sim(sim, stopping)


if __name__ == "__main__":
    sys.exit(main())
