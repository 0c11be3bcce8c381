"""The ASGI lifespan of a raw test server: acknowledged, nothing else done."""

from __future__ import annotations

from typing import Any


async def run_lifespan(receive: Any, send: Any) -> None:
    """Answer ``lifespan.startup`` and ``lifespan.shutdown`` (ASGI lifespan spec 2.0) until the
    server shuts down; call it for a ``scope["type"] == "lifespan"`` scope."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
