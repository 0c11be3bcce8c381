"""A chat prompt's token ids, from a replica's own ``/tokenize`` (``routing.tokenize: replica``).

The exact index (:mod:`gateway.fleet.exact_index`) matches token ids, and a chat request's ids
depend on the model's chat template, which the gateway does not render. vLLM's ``POST
/tokenize`` with ``messages`` (``TokenizeChatRequest``: ``add_generation_prompt`` true by
default, as a chat completion renders it) applies the same template and tokenizer as the chat
endpoint, so its ``tokens`` are the prompt's ids exactly. It costs one round trip to a replica
the egress policy already allows for the request, through the same policy-checked session; a
failure or a slow answer only means the estimate decides.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from ssl import SSLContext
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from gateway.fleet.replica import Replica

__all__ = ["replica_token_ids"]

MAX_TOKENIZE_BODY = 16 * 1024 * 1024
"""Largest ``/tokenize`` answer read, bytes (a prompt of ~1M tokens as JSON)."""


async def replica_token_ids(
    session: aiohttp.ClientSession,
    replica: Replica,
    served_model: str,
    body: Mapping[str, Any],
    timeout_s: float,
    ssl: SSLContext | bool = True,
) -> list[int] | None:
    """The token ids ``replica`` computes for the chat ``body``'s prompt, or ``None``.

    Args:
        session: The app's upstream session (egress policy checks).
        replica: Where to ask (one of the request's allowed candidates).
        served_model: The model name the replica serves.
        body: The chat request body (``messages``, optional ``tools``).
        timeout_s: Whole exchange, seconds.
        ssl: ``ssl`` argument for ``https://`` replicas.

    Returns:
        The ids, or ``None`` on any failure (not 200, not a list of ints, timeout).
    """
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    doc: dict[str, Any] = {"model": served_model, "messages": messages,
                           "add_generation_prompt": True}
    if body.get("tools"):
        doc["tools"] = body["tools"]
    headers = {"content-type": "application/json"}
    if replica.api_key:
        headers["authorization"] = f"Bearer {replica.api_key}"
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(replica.url + "/tokenize", data=json.dumps(doc),
                                    headers=headers, allow_redirects=False, ssl=ssl) as resp:
                if resp.status != 200:
                    return None
                raw = await resp.content.read(MAX_TOKENIZE_BODY + 1)
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
    if len(raw) > MAX_TOKENIZE_BODY:
        return None
    try:
        tokens = json.loads(raw).get("tokens")
    except (ValueError, AttributeError):
        return None
    if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        return None
    return tokens
