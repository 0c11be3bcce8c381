"""Pipelining of concurrent Lua script calls to Redis.

Every script call made during one event-loop tick is sent in one pipeline (``EVALSHA`` per
call, no MULTI: each script is atomic on its own), so N concurrent requests cost one write and
one read instead of N of each. Scripts are loaded once (``SCRIPT LOAD``) and again after a
``NOSCRIPT`` reply (a restarted or flushed Redis), then the affected calls are retried once.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import redis.asyncio as redis_async
from redis.exceptions import NoScriptError, ResponseError


class ScriptBatcher:
    """Coalesces ``EVALSHA`` calls per event-loop tick.

    Args:
        client: the Redis client.
        scripts: name -> Lua source.
    """

    def __init__(self, client: redis_async.Redis, scripts: dict[str, str]) -> None:
        self._redis = client
        self._sources = dict(scripts)
        self._sha = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in scripts.items()}  # noqa: S324 - Redis names scripts by SHA-1
        self._queue: list[tuple[str, list[str], list[Any], asyncio.Future[Any]]] = []
        self._scheduled = False
        self._loaded = False

    async def call(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` with ``keys`` and ``args``; raises what Redis raises."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.append((name, keys, args, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._start_flush)
        return await future

    def _start_flush(self) -> None:
        self._scheduled = False
        batch, self._queue = self._queue, []
        if batch:
            asyncio.get_running_loop().create_task(self._flush(batch))

    async def _load(self) -> None:
        for source in self._sources.values():
            await self._redis.script_load(source)
        self._loaded = True

    async def _flush(
        self, batch: list[tuple[str, list[str], list[Any], asyncio.Future[Any]]]
    ) -> None:
        try:
            if not self._loaded:
                await self._load()
            results = await self._send(batch)
            retry = [i for i, r in enumerate(results) if _is_noscript(r)]
            if retry:
                await self._load()
                again = await self._send([batch[i] for i in retry])
                for i, result in zip(retry, again, strict=True):
                    results[i] = result
        except BaseException as exc:  # connection errors: every call of the batch fails
            self._loaded = False
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (*_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def _send(
        self, batch: list[tuple[str, list[str], list[Any], asyncio.Future[Any]]]
    ) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for name, keys, args, _ in batch:
            pipe.evalsha(self._sha[name], len(keys), *keys, *args)
        return list(await pipe.execute(raise_on_error=False))


def _is_noscript(result: Any) -> bool:
    return isinstance(result, NoScriptError) or (
        isinstance(result, ResponseError) and str(result).startswith("NOSCRIPT")
    )
