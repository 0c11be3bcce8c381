"""Where one small non-streamed request's time goes inside the gateway: CPU per request and a
wall-clock trace of one request.

The gateway runs in this process (``assemble`` + ``create_app`` + the lifespan, served by the
production protocol class, :class:`gateway.h1.server.ServerProtocol`; with ``--source`` of a
checkout from before it, uvicorn's protocol of ``gateway.http_guard``) in front of a real
``vllm-sim`` on loopback; the client side is an in-memory transport (no client socket, no client
process), so the numbers are the gateway's own: its request parsing, relay, upstream client and
response writing, the upstream socket's system calls, and the event-loop iterations between
them. Requests are sent one at a time (concurrency 1) on one kept-alive connection, with the
garbage collector set up as ``gateway serve`` sets it (:mod:`gateway.serving.runtime_tuning`).

Prints the process CPU time per request (``time.process_time``) and, with ``--trace``, the
marks of one request after the warm-up, in microseconds from the moment its bytes were handed
to the server: event-loop iterations, the relay's steps, the upstream write and reads, and the
writes to the client. The marks wrap the named functions for that one request only (a few
microseconds each), so read the gaps, not the sum. ``--source DIR`` runs another checkout's
packages (``git archive main gateway policy weights airgap vllm_sim | tar -x -C DIR``).

Usage::

    .venv/bin/python bench/request_path.py --requests 3000
    .venv/bin/python bench/request_path.py --trace
    .venv/bin/python bench/request_path.py --profile /tmp/rp.prof  # then pstats, sort tottime
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
_ap.add_argument("--requests", type=int, default=3000)
_ap.add_argument("--trace", action="store_true", help="print the marks of one request")
_ap.add_argument("--source", help="run another checkout's packages from this directory")
_ap.add_argument("--profile", metavar="FILE",
                 help="write cProfile statistics of the measured requests to FILE")
ARGS = _ap.parse_args()
if ARGS.source:
    sys.path.insert(0, ARGS.source)

import yaml  # noqa: E402
from relay_load import request_bytes  # noqa: E402
from relay_procs import BENCH_KEY, bind_config, default_config, start_sim  # noqa: E402


class _Client(asyncio.Transport):
    """The client end of one kept-alive connection, in memory: collects what the server writes
    and resolves :attr:`done` once a whole ``Content-Length`` response is in."""

    def __init__(self) -> None:
        super().__init__()
        self.buf = bytearray()
        self.done: asyncio.Future[None] | None = None
        self.on_write: Callable[[], None] | None = None

    def write(self, data: Any) -> None:
        if self.on_write is not None and data:
            self.on_write()
        self.buf += data
        head, sep, body = bytes(self.buf).partition(b"\r\n\r\n")
        if not sep or self.done is None or self.done.done():
            return
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length" and len(body) >= int(value):
                self.done.set_result(None)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


@contextmanager
def _marks(targets: list[tuple[Any, str, str]], out: list[tuple[float, str]]) -> Iterator[None]:
    """Wrap ``(owner, attribute, label)`` callables so each call adds ``label>`` and ``label<``
    marks to ``out``; restored on exit."""
    clock = time.perf_counter
    saved = []
    for owner, attr, label in targets:
        orig = getattr(owner, attr)
        saved.append((owner, attr, orig))
        if asyncio.iscoroutinefunction(orig):
            async def wrapped_async(*a: Any, _o: Any = orig, _l: str = label, **k: Any) -> Any:
                out.append((clock(), _l + ">"))
                try:
                    return await _o(*a, **k)
                finally:
                    out.append((clock(), _l + "<"))
            setattr(owner, attr, wrapped_async)
        else:
            def wrapped(*a: Any, _o: Any = orig, _l: str = label, **k: Any) -> Any:
                out.append((clock(), _l + ">"))
                try:
                    return _o(*a, **k)
                finally:
                    out.append((clock(), _l + "<"))
            setattr(owner, attr, wrapped)
    try:
        yield
    finally:
        for owner, attr, orig in saved:
            setattr(owner, attr, orig)


def _trace_targets() -> list[tuple[Any, str, str]]:
    import aiohttp
    import aiohttp.client_proto
    import aiohttp.http_writer

    from gateway.h1 import asgi_io
    from gateway.relay import forward, rewrite
    from gateway.relay import pipeline as relay

    targets: list[tuple[Any, str, str]] = [
        (asyncio.base_events.BaseEventLoop, "_run_once", "loop iteration"),
        (relay, "handle", "relay.handle"),
        (relay, "parse_body", "parse_body"),
        (relay, "forward", "forward"),
        (rewrite.ParsedBody, "upstream_body", "upstream_body"),
        (aiohttp.ClientSession, "_request", "aiohttp request (until the response head)"),
        (aiohttp.http_writer.StreamWriter, "_writelines", "upstream write"),
        (aiohttp.client_proto.ResponseHandler, "data_received", "upstream read"),
        (forward, "_relay_response", "relay response"),
        (asgi_io.Responder, "start", "response start"),
        (asgi_io.Responder, "body", "response body"),
    ]
    return targets


async def _run(sim_url: str, tmp: Path) -> None:
    from gateway.app import create_app
    from gateway.assembly import assemble
    from gateway.config.loader import load
    from gateway.serving.runtime_tuning import freeze_startup_heap, tune_gc

    cfg = bind_config(default_config(), sim_url, 8000)
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    settings = load(path)
    app = create_app(settings, assemble(settings, tmp))
    proto, lifespan = await _server_protocol(app, settings)
    # The collector settings of `gateway serve` (gateway.serving.server: thresholds at start, the
    # start-up heap frozen once the lifespan has started); the defaults would add young
    # collections over the whole heap to the per-request figures.
    tune_gc()
    freeze_startup_heap()
    body = {"model": "m", "stream": False, "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi"}]}
    req = request_bytes("127.0.0.1:8000", "/v1/chat/completions", body, BENCH_KEY, True)
    client = _Client()
    proto.connection_made(client)
    loop = asyncio.get_running_loop()

    async def one() -> None:
        client.buf.clear()
        client.done = loop.create_future()
        proto.data_received(req)
        await client.done
        await asyncio.sleep(0)  # the rest of the request's task (accounting, next cycle)

    for _ in range(300):
        await one()
    profiler = None
    if ARGS.profile:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(ARGS.requests):
        await one()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(ARGS.profile)
    cpu = (time.process_time() - cpu0) / ARGS.requests
    wall = (time.perf_counter() - wall0) / ARGS.requests
    print(f"{ARGS.requests} requests at concurrency 1: gateway CPU {cpu * 1e6:.0f} us per "
          f"request, wall {wall * 1e6:.0f} us (the simulator's time included)")
    if ARGS.trace:
        best: list[tuple[float, str]] = []
        for _ in range(20):  # the least disturbed of 20 (a shared machine preempts at random)
            marks: list[tuple[float, str]] = []
            client.on_write = lambda m=marks: m.append((time.perf_counter(), "client write"))
            with _marks(_trace_targets(), marks):
                marks.append((time.perf_counter(), "request bytes handed to the server"))
                client.buf.clear()
                client.done = loop.create_future()
                proto.data_received(req)
                marks.append((time.perf_counter(), "server parsed the head, task created"))
                await client.done
                await asyncio.sleep(0)
            client.on_write = None
            if not best or marks[-1][0] - marks[0][0] < best[-1][0] - best[0][0]:
                best = marks
        t0 = best[0][0]
        for t, label in best:
            print(f"{(t - t0) * 1e6:8.1f} us  {label}")
    await lifespan.shutdown()


async def _server_protocol(app: Any, settings: Any) -> tuple[Any, Any]:
    """The server protocol of one connection and the started lifespan: the gateway's own
    server, or (a checkout from before it, ``--source``) uvicorn's protocol class."""
    try:
        from gateway.h1.lifespan import Lifespan
        from gateway.h1.server import ServerContext, ServerProtocol
        from gateway.serving.server import server_limits
    except ImportError:
        from gateway.http_guard import server_options  # type: ignore[import-not-found]
        from uvicorn.config import Config
        from uvicorn.lifespan.on import LifespanOn
        from uvicorn.server import ServerState

        config = Config(app, **server_options(settings.limits))
        config.load()
        old = LifespanOn(config)
        await old.startup()
        return config.http_protocol_class(config=config, server_state=ServerState(),
                                          app_state=old.state), old
    lifespan = Lifespan(app)
    assert await lifespan.startup(), lifespan.failure
    max_body = settings.limits.max_body_bytes
    context = ServerContext(app, server_limits(settings.limits), lambda: max_body,
                            state=lifespan.state)
    return ServerProtocol(context), lifespan


def main() -> int:
    sim = start_sim("m", tokens=1)
    try:
        with tempfile.TemporaryDirectory(prefix="request-path-") as tmp:
            asyncio.run(_run(sim.url, Path(tmp)))
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
