"""The ASGI lifespan protocol, driven by the server (https://asgi.readthedocs.io/en/latest/
specs/lifespan.html).

:class:`Lifespan` runs the app's ``lifespan`` scope in a task: :meth:`Lifespan.startup` sends
``lifespan.startup`` and waits for ``lifespan.startup.complete`` (or ``.failed``, or the app
raising), :meth:`Lifespan.shutdown` the same for the shutdown. The ``state`` dictionary of the
scope is what each request's ``scope["state"]`` is copied from.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["Lifespan"]

_log = logging.getLogger(__name__)


class Lifespan:
    """One application's lifespan.

    Args:
        app: The ASGI application.

    Attributes:
        state: The lifespan state shared with requests.
        failure: Why start-up (or shutdown) failed, one line, or ``None``.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.state: dict[str, Any] = {}
        self.failure: str | None = None
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._startup_done = asyncio.Event()
        self._shutdown_done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._unsupported = False

    async def startup(self) -> bool:
        """Start the app; ``True`` when it started (or has no lifespan), ``False`` on failure
        (:attr:`failure` says why)."""
        self._task = asyncio.get_running_loop().create_task(self._main())
        await self._inbox.put({"type": "lifespan.startup"})
        await self._startup_done.wait()
        return self.failure is None

    async def shutdown(self) -> None:
        """Tell the app to shut down and wait for it (a failure is logged)."""
        if self._task is None or self._task.done():
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        await self._shutdown_done.wait()

    async def _main(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"},
                 "state": self.state}
        try:
            await self.app(scope, self._inbox.get, self._send)
        except BaseException as exc:
            if self.failure is not None:
                pass  # the start-up failure the app reported (lifespan.startup.failed): logged
            elif not self._startup_done.is_set():
                if self.failure is None:
                    self.failure = f"{type(exc).__name__}: {exc}"
                    # One line names it (the CLI's error line repeats it with a hint); the
                    # traceback is for --log-level debug, not for an operator's terminal.
                    _log.error("Application startup failed: %s", self.failure)
                    _log.debug("start-up failure", exc_info=exc)
            elif not self._shutdown_done.is_set():
                _log.error("Application shutdown failed", exc_info=exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._startup_done.set()
            self._shutdown_done.set()

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "lifespan.startup.complete":
            self._startup_done.set()
        elif kind == "lifespan.startup.failed":
            text = str(message.get("message") or "").strip()
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            self.failure = lines[-1] if lines else "application start-up failed"
            _log.error("Application startup failed: %s", self.failure)
            self._startup_done.set()
        elif kind == "lifespan.shutdown.complete":
            self._shutdown_done.set()
        elif kind == "lifespan.shutdown.failed":
            _log.error("Application shutdown failed: %s", message.get("message", ""))
            self._shutdown_done.set()
