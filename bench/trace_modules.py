"""Which project modules does one streamed chat completion cross, with every feature on?

Builds the gateway the way ``gateway serve`` does (:func:`gateway.assembly.assemble`,
:func:`gateway.app.create_app` and the gateway's own HTTP server,
:class:`gateway.serving.server.GatewayServer`, on a loopback port) with the audit log
(SQLite), quotas (memory backend), the egress policy (routing and the policy-checked
connector; the process guard stays off so the script can run inside a test) and telemetry
(spans and metrics) on, in front of the vLLM simulator. One warm-up request loads everything
lazily imported; then a ``sys.setprofile`` hook on the event loop's thread records every
Python function call during one streamed ``POST /v1/chat/completions`` sent over a real TCP
connection (from the first bytes the server reads until the client has read the last chunk):
the server's protocol callbacks count as the request's. The client (asyncio streams) and the
simulator (another thread) are not project code and are not counted.

The relay's stages (:data:`gateway.relay.pipeline.STAGES`) are reported in the order their
functions were first called.

Calls are attributed to the task that makes them. The request's own calls (its ASGI task and
the tasks it starts) are the modules it crosses. The audit log's group-commit task (named
``audit-writer ...``) builds, hashes and stores the records of every request in batches; the
request hands its records over with one call (``AuditLog.append``) and waits until they are
durable, so that task's calls are listed separately as what the request waits for, not as
modules it crosses.

Prints both lists in first-call order with their call counts, the number of switches between
modules (consecutive calls in different modules, on the request's side), and exits 1 if the
request crossed more than ``--max`` modules.

Usage::

    .venv/bin/python bench/trace_modules.py [--max 16] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import sqlite3
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import uvicorn  # noqa: E402

from gateway.app import create_app, direct_routes  # noqa: E402
from gateway.assembly import assemble  # noqa: E402
from gateway.audit import Signer, generate_key_file, write_key_pair  # noqa: E402
from gateway.config.loader import parse  # noqa: E402
from gateway.relay.pipeline import STAGES  # noqa: E402
from gateway.serving.server import GatewayServer, ServerConfig, server_limits  # noqa: E402
from vllm_sim import SimConfig  # noqa: E402
from vllm_sim import create_app as create_sim  # noqa: E402

PACKAGES = ("gateway", "policy", "weights", "airgap")
KEY = "sg-trace-key"
MODEL = "m"
BODY = json.dumps({
    "model": MODEL,
    "messages": [{"role": "user", "content": "hello"}],
    "stream": True,
    "max_tokens": 8,
}).encode()


_STAGE_CODES = {stage.run.__code__: stage.name for stage in STAGES}

COMMITTER_TASK = "audit-writer"
"""Name prefix of the audit log's group-commit task (``gateway.audit.writer``)."""


@dataclass
class Trace:
    """Calls seen by the profile hook, by project module.

    ``calls`` are the request's own calls; ``committer`` those of the audit log's group-commit
    task, which the request waits for.
    """

    calls: dict[str, int] = field(default_factory=dict)
    committer: dict[str, int] = field(default_factory=dict)
    switches: int = 0
    stages: list[str] = field(default_factory=list)
    _last: str | None = None
    _names: dict[str, str | None] = field(default_factory=dict)

    def module_of(self, filename: str) -> str | None:
        """The dotted project module of a source file, or ``None`` outside the packages."""
        name = self._names.get(filename, "")
        if name != "":
            return name
        module: str | None = None
        path = Path(filename)
        if path.suffix == ".py" and path.is_absolute():
            try:
                rel = path.relative_to(ROOT)
            except ValueError:
                rel = None
            if rel is not None and rel.parts and rel.parts[0] in PACKAGES:
                parts = list(rel.with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                module = ".".join(parts)
        self._names[filename] = module
        return module

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        """``sys.setprofile`` callback: count Python calls into project modules."""
        if event != "call":
            return
        stage = _STAGE_CODES.get(frame.f_code)
        if stage is not None and stage not in self.stages:
            self.stages.append(stage)
        module = self.module_of(frame.f_code.co_filename)
        if module is None:
            return
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running loop: not a task's call
            task = None
        if task is not None and task.get_name().startswith(COMMITTER_TASK):
            self.committer[module] = self.committer.get(module, 0) + 1
            return
        self.calls[module] = self.calls.get(module, 0) + 1
        if module != self._last:
            if self._last is not None:
                self.switches += 1
            self._last = module


def _sim_server() -> tuple[uvicorn.Server, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_sim(SimConfig(models=["served"])), log_level="warning",
                            lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the simulator did not start within 20 s")
        time.sleep(0.01)
    return server, port


def _config(tmp: Path, sim_port: int) -> dict[str, Any]:
    key_file, _ = write_key_pair(Signer.generate(), tmp / "audit.key")
    (tmp / "policy.yaml").write_text(
        "version: 1\ndata_classes: [public]\n"
        f"destinations:\n  - {{id: sim, host: 127.0.0.1, port: {sim_port}, region: local, "
        "jurisdiction: EU, operator: acme}\n"
        "rules:\n  - {id: public-anywhere, classes: [public]}\n"
    )
    return {
        "listen": {"host": "127.0.0.1", "port": 0},
        "models": [{"name": MODEL, "served_model_name": "served", "replicas": [
            {"url": f"http://127.0.0.1:{sim_port}", "destination": "sim"}]}],
        "keys": [{"id": "k", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                  "team": "t", "data_class": "public", "models": [MODEL]}],
        "health": {"active": False},
        "logging": {"access_log": False},
        "policy": {"file": "policy.yaml", "guard": "off"},
        "audit": {
            "store": f"sqlite://{tmp / 'audit.db'}",
            "signing_key_file": str(key_file),
            "pseudonym_key_file": str(generate_key_file(tmp / "pseudonym.key")),
            "replica_id": "trace",
        },
        "quotas": {"backend": "memory", "defaults": {"key": {"requests_per_minute": 1000}}},
        "telemetry": {"admin": {"host": "127.0.0.1", "port": 0}},
    }


@dataclass
class Response:
    """What the client of the traced request received."""

    status: int = 0
    body: bytearray = field(default_factory=bytearray)
    headers: dict[str, str] = field(default_factory=dict)


async def _request(port: int) -> Response:
    """One streamed chat completion over a new TCP connection to the gateway."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n"
                     + f"authorization: Bearer {KEY}\r\n".encode()
                     + b"content-type: application/json\r\nconnection: close\r\n"
                     + f"content-length: {len(BODY)}\r\n\r\n".encode() + BODY)
        await writer.drain()
        raw = await reader.read()  # the server closes after the response (connection: close)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    response = Response(status=int(lines[0].split()[1]))
    response.headers = {k.strip().lower(): v.strip()
                        for k, _, v in (line.partition(":") for line in lines[1:])}
    response.body.extend(body)  # chunked framing left in: the events are found inside it
    return response


def _check(response: Response, what: str) -> None:
    if response.status != 200 or b"data: [DONE]" not in response.body:
        raise RuntimeError(f"{what} failed: {response.status} {bytes(response.body[:200])!r}")


async def trace_one_request(app: Any, settings: Any, on_refused: Any) -> tuple[Trace, Response]:
    """Serve the app on a loopback port, warm it up with one request, then trace one."""
    max_body = settings.limits.max_body_bytes
    server = GatewayServer(ServerConfig(app, host="127.0.0.1", port=0,
                                        limits=server_limits(settings.limits),
                                        body_limit=lambda: max_body, on_refused=on_refused,
                                        routes=direct_routes()))
    await server.startup()
    if not server.started:
        raise RuntimeError(f"the gateway did not start: {server.failure}")
    port = server.port
    try:
        _check(await _request(port), "warm-up request")  # lazy imports, pools, caches
        trace = Trace()
        sys.setprofile(trace.hook)
        try:
            response = await _request(port)
        finally:
            sys.setprofile(None)
        _check(response, "traced request")
        return trace, response
    finally:
        await server.shutdown()


def _evidence(db: Path, response: Response) -> dict[str, Any]:
    """What shows that every feature acted on the traced request.

    The audit records of the request (with the egress policy's deciding rule), the quota
    headers of the response and the trace id telemetry gave it.
    """
    request_id = response.headers.get("x-request-id", "")
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT type, body FROM audit_records WHERE request_id = ? ORDER BY seq",
            (request_id,)).fetchall()
    records = [(kind, json.loads(body)["data"]) for kind, body in rows]
    return {
        "request_id": request_id,
        "audit_records": [kind for kind, _ in records],
        "policy_rule": next((d.get("policy_rule") for _, d in records), None),
        "ratelimit_headers": sorted(h for h in response.headers if h.startswith("x-ratelimit")),
    }


def run() -> tuple[Trace, dict[str, Any]]:
    """Set up the simulator and the fully featured gateway, and trace one request.

    Returns:
        The trace, and the evidence that every feature acted on the request.
    """
    server, port = _sim_server()
    try:
        with tempfile.TemporaryDirectory(prefix="sg-trace-") as tmp:
            settings = parse(_config(Path(tmp), port), {})
            gateway = assemble(settings, Path(tmp))
            app = create_app(settings, gateway)
            on_refused = gateway.audit.http_refused if gateway.audit is not None else None
            trace, response = asyncio.run(trace_one_request(app, settings, on_refused))
            return trace, _evidence(Path(tmp) / "audit.db", response)
    finally:
        server.should_exit = True


def main(argv: list[str] | None = None) -> int:
    """Print the crossed modules; exit 1 above ``--max``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--max", type=int, default=16, help="most modules allowed (16)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    trace, evidence = run()
    modules = list(trace.calls)
    union = set(modules) | set(trace.committer)
    if args.json:
        print(json.dumps({"modules": trace.calls, "count": len(modules),
                          "switches": trace.switches, "max": args.max,
                          "stages": trace.stages,
                          "committer": trace.committer, "with_committer": len(union),
                          "evidence": evidence}))
    else:
        print(f"{len(modules)} project modules crossed by one streamed chat completion "
              f"(audit, quotas, policy, telemetry on); {trace.switches} switches:")
        for module in modules:
            print(f"  {module:40s} {trace.calls[module]:6d} calls")
        print(f"the audit log's group-commit task, which the response waits for, crossed "
              f"{len(trace.committer)} modules ({len(union)} together with the request's):")
        for module, count in trace.committer.items():
            print(f"  {module:40s} {count:6d} calls")
        print(f"the relay's stages, in the order they ran: {' -> '.join(trace.stages)}")
        print(f"the request: {evidence}")
    return 0 if len(modules) <= args.max else 1


if __name__ == "__main__":
    sys.exit(main())
