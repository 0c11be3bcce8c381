"""Subprocesses of ``bench/relay.py``: the vLLM simulator and gateway variants.

Both run as separate processes under uvicorn with the standard asyncio loop, each bound to a
free loopback port; they are stopped (SIGTERM, then SIGKILL) when the benchmark ends.
"""

from __future__ import annotations

import copy
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

BENCH_KEY = "sg-bench-relay-key"
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (``VmRSS`` of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds used so far by ``pid`` (``/proc/<pid>/stat`` fields 14, 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Proc:
    """A server subprocess on a loopback port."""

    def __init__(self, name: str, argv: list[str], port: int, ready_path: str,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        try:
            self._wait_ready(ready_path)
        except BaseException:
            self.stop()  # never left running unowned: the caller has no handle on it yet
            raise

    def _wait_ready(self, path: str, timeout_s: float = 240.0) -> None:
        # Generous: on a 2-core machine at load 12-14 the gateway's imports alone took 57 s
        # of wall time (4.4 s of CPU), and a run that lost a start lost all its phases.
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(self.url + path, timeout=2).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log()
                self.stop()  # else a server still starting outlives the benchmark
                raise RuntimeError(f"{self.name} did not start:\n{log}")
            time.sleep(0.1)

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    @property
    def rss_kib(self) -> int:
        return rss_kib(self.proc.pid)

    @property
    def cpu_s(self) -> float:
        return cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def start_sim(model: str, tokens: int, itl_ms: float = 0.0, ttft_ms: float = 0.0) -> Proc:
    """Start ``vllm-sim`` serving ``model`` with ``tokens`` tokens per response."""
    port = free_port()
    argv = [str(BIN / "vllm-sim"), "--port", str(port), "--model", model, "--tokens", str(tokens),
            "--itl-ms", str(itl_ms), "--ttft-ms", str(ttft_ms), "--max-model-len", "100000"]
    return Proc(f"vllm-sim:{port}", argv, port, "/health")


def default_config() -> dict[str, Any]:
    """The baseline gateway config: one model ``m``, one key, no health probes, no access log."""
    return {
        "models": [{"name": "m", "replicas": [{"url": "http://127.0.0.1:1"}]}],
        "keys": [],
        "health": {"active": False},
        "logging": {"access_log": False},
    }


def load_variant(path: str | None) -> dict[str, Any]:
    """A variant config: the YAML file at ``path`` or, for None, ``default_config()``."""
    if path is None:
        return default_config()
    doc = yaml.safe_load(Path(path).read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a YAML mapping")
    return doc


def bind_config(base: dict[str, Any], sim_url: str, port: int) -> dict[str, Any]:
    """Point a variant config at this run: listen port, every replica -> the simulator, bench key.

    The bench key is added (id ``bench-relay``, all models) unless the config already has it.
    """
    cfg = copy.deepcopy(base)
    cfg["listen"] = {"host": "127.0.0.1", "port": port}
    for model in cfg.get("models", []):
        model["served_model_name"] = "m"
        for replica in model.get("replicas", []):
            replica["url"] = sim_url
    digest = hashlib.sha256(BENCH_KEY.encode()).hexdigest()
    keys = cfg.setdefault("keys", [])
    if not any(k.get("sha256") == digest for k in keys):
        keys.append({"id": "bench-relay", "sha256": digest,
                     "models": [m["name"] for m in cfg.get("models", [])]})
    return cfg


def start_gateway(name: str, base: dict[str, Any], sim_url: str, workdir: Path,
                  source: str | None = None) -> Proc:
    """Start ``gateway serve --config <file>`` for a variant config bound to ``sim_url``.

    Args:
        source: A directory holding another build's ``gateway`` package (and its siblings),
            put first on ``PYTHONPATH``: two builds measured side by side in one run.
    """
    port = free_port()
    cfg = bind_config(base, sim_url, port)
    path = workdir / f"{name}-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    exe = BIN / "gateway"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]
    env = {"PYTHONPATH": source} if source else None
    return Proc(f"gateway:{name}", [*argv, "serve", "--config", str(path)], port, "/healthz",
                env=env)


def model_name(base: dict[str, Any]) -> str:
    """The model clients ask for: the first model of the config."""
    return str(base["models"][0]["name"])


NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream sim {{
        server 127.0.0.1:{upstream_port};
        keepalive 1024;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        keepalive_requests 100000;
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
        }}
    }}
}}
"""


def nginx_binary() -> str | None:
    """Path of Debian's ``nginx`` (``/usr/sbin/nginx``) or one on ``PATH``, if installed."""
    import shutil

    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    return found


def start_nginx(upstream_port: int, workdir: Path) -> Proc:
    """Start nginx as a plain reverse proxy in front of ``127.0.0.1:upstream_port``.

    One process (``master_process off``, one worker's work), ``proxy_buffering off``, HTTP/1.1
    to the upstream with a keep-alive pool: the C baseline of the stall benchmark. It runs in the
    foreground as this user's child with its own config and temp directory (never the system
    service).

    Raises:
        RuntimeError: nginx is not installed or did not start.
    """
    exe = nginx_binary()
    if exe is None:
        raise RuntimeError("nginx is not installed (Debian: apt-get install -y nginx-light)")
    port = free_port()
    d = Path(tempfile.mkdtemp(prefix="nginx-", dir=workdir))
    conf = d / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=d, port=port, upstream_port=upstream_port))
    return Proc(f"nginx:{port}", [exe, "-p", str(d), "-c", str(conf), "-e", str(d / "error.log")],
                port, "/health")
