"""Backends of kind ``litellm``: a chat completion called through litellm as a library.

For a hosted model reached through one of litellm's provider adapters (``replicas[].kind:
litellm``, ``litellm_model: "hosted_vllm/<name>"``, ``"openai/<name>"``, ...). vLLM replicas
keep the byte relay; this module is imported only when such a replica is configured, and
litellm itself is imported at start-up by ``gateway serve`` through
``policy.import_litellm()`` (after the egress guard is installed, with litellm's hidden egress
switched off).

All three policy layers apply: routing picks the replica by its destination like any other;
litellm is handed an ``openai.AsyncOpenAI`` client over the policy-checked httpx transport
(``policy.make_httpx_client``, sharing the guard's pins), so it never opens connections of its
own; the process guard sees everything else.

Only ``POST /v1/chat/completions`` is supported on such replicas (400 ``unsupported_endpoint``
otherwise). The answer is re-encoded from litellm's response objects (OpenAI shapes); a stream
is sent as SSE events ending with ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import httpx

from gateway.errors import (
    GatewayError,
    InvalidRequest,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeout,
    sse_error_event,
)
from gateway.relay.exchange import Exchange
from gateway.relay.records import RequestRecord
from gateway.routing import Replica
from policy import EgressDenied

__all__ = ["attempt", "make_client"]

_DROP = frozenset({"model", "stream", "stream_options", "messages"})


def make_client(replica_url: str, api_key: str | None, matcher: Any = None) -> Any:
    """An ``openai.AsyncOpenAI`` client for a litellm replica (policy-checked when ``matcher``).

    Args:
        replica_url: The replica root URL (``/v1`` is appended).
        api_key: The replica's credential.
        matcher: ``EgressMatcher`` of the egress policy (its pins are the guard's), or ``None``.
    """
    import openai

    from policy import DeniedAddressAsyncTransport, make_httpx_client

    http = (make_httpx_client(matcher) if matcher is not None
            else httpx.AsyncClient(trust_env=False, follow_redirects=False,
                                   transport=DeniedAddressAsyncTransport()))
    return openai.AsyncOpenAI(base_url=replica_url + "/v1", api_key=api_key or "unused",
                              http_client=http, max_retries=0)  # type: ignore[arg-type]


def _map(exc: BaseException, url: str) -> GatewayError:  # url: Replica.label, never the URL
    if isinstance(exc, EgressDenied):
        return UpstreamError(
            f"The egress policy refused the connection to the model backend ({url}): "
            f"{exc.reason}",
            code="upstream_egress_denied",
        )
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    if "Timeout" in name:
        return UpstreamConnectTimeout(f"Timed out talking to the model backend ({url}).")
    if "APIConnectionError" in name or "ConnectError" in name:
        return UpstreamConnectError(f"Could not connect to the model backend ({url}).")
    if isinstance(status, int) and status in (429, 502, 503):
        return UpstreamStatusError(f"The model backend answered {status}.", status=status)
    if isinstance(status, int) and 400 <= status < 500:
        return InvalidRequest(f"The model backend refused the request ({status}).",
                              code="upstream_invalid_request")
    return UpstreamError(f"Error talking to the model backend ({url}): {name}")


def _usage(record: RequestRecord, usage: Any) -> None:
    if usage is not None:
        record.used(getattr(usage, "prompt_tokens", None),
                    getattr(usage, "completion_tokens", None))


async def attempt(ex: Exchange, replica: Replica) -> GatewayError | None:
    """One attempt on a litellm replica (same contract as the byte relay's attempt).

    Returns:
        ``None`` when done, or a retryable error (429/502/503) for the caller to retry.

    Raises:
        UpstreamConnectError: Connection failed (the caller retries).
        GatewayError: Any failure before the response started.
    """
    record, out = ex.record, ex.out
    if record.path != "/v1/chat/completions":
        raise InvalidRequest(
            "Backends of kind litellm serve only /v1/chat/completions.",
            code="unsupported_endpoint",
        )
    litellm = sys.modules.get("litellm")
    if litellm is None:  # not imported at start-up (library use): do it now, offline
        from policy import import_litellm

        litellm = import_litellm()
    values = ex.parsed.values
    params = {k: v for k, v in values.items() if k not in _DROP}
    stream = ex.parsed.stream
    if stream:
        params["stream_options"] = {"include_usage": True}
    if replica.client is None:
        replica.client = make_client(replica.url, replica.api_key)
    try:
        async with asyncio.timeout(ex.state.settings.timeouts.first_byte_s):
            resp = await litellm.acompletion(
                model=replica.litellm_model, messages=values.get("messages"),
                api_base=replica.url + "/v1", api_key=replica.api_key or "unused",
                client=replica.client, stream=stream, **params,
            )
    except TimeoutError as exc:
        ex.pool.eject(replica)
        raise UpstreamTimeout(
            f"The model backend ({replica.label}) did not answer within "
            f"{ex.state.settings.timeouts.first_byte_s} s."
        ) from exc
    except Exception as exc:
        err = _map(exc, replica.label)
        if isinstance(err, UpstreamStatusError):
            ex.pool.eject(replica)
            return err
        if not isinstance(err, InvalidRequest):
            ex.pool.eject(replica)
        raise err from exc
    record.first_byte(round((time.perf_counter() - ex.t0) * 1000.0, 3))
    if not stream:
        _usage(record, getattr(resp, "usage", None))
        data = resp.model_dump_json().encode()
        await out.start(200, [(b"content-type", b"application/json"),
                              (b"content-length", str(len(data)).encode())])
        ex.watch.finish()
        await out.body(data, more=False)
        record.ended("ok")
        return None
    await out.start(200, [(b"content-type", b"text/event-stream; charset=utf-8"),
                          (b"cache-control", b"no-cache")])
    wants_usage = ex.parsed.client_wants_usage
    try:
        async for chunk in resp:
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                _usage(record, usage)
                if not chunk.choices and not wants_usage:
                    continue
            await out.body(b"data: " + chunk.model_dump_json().encode() + b"\n\n")
    except Exception as exc:
        err = _map(exc, replica.label)
        record.failed("upstream_error", err.code)
        await out.body(sse_error_event(err), more=False)
        return None
    ex.watch.finish()
    await out.body(b"data: [DONE]\n\n", more=False)
    record.ended("ok")
    return None
