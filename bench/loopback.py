"""An ASGI app served on a free loopback port in a thread of the benchmark's process.

Used by the benchmarks that drive the gateway and the vLLM simulator from one process
(``bench/batch.py``, ``bench/pii.py``); uvicorn through its public API (``Server``/``Config``).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn

__all__ = ["ThreadServer"]


class ThreadServer:
    """``app`` served on ``127.0.0.1`` at a free port, started on construction.

    Args:
        app: The ASGI application (its lifespan is run).
        start_timeout_s: Longest wait in seconds for the server to start.

    Raises:
        RuntimeError: The server did not start within ``start_timeout_s``.
    """

    def __init__(self, app: Any, start_timeout_s: float = 30.0) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.server = uvicorn.Server(uvicorn.Config(
            app, host="127.0.0.1", port=self.port, loop="asyncio", lifespan="on",
            log_level="warning"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()),
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + start_timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop serving and wait (at most 10 s) for the thread."""
        self.server.should_exit = True
        self.thread.join(10)
