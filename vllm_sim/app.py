"""The vLLM simulator as a raw ASGI application (``create_app(SimConfig) -> SimApp``).

This is a SIMULATOR of vLLM's OpenAI-compatible server for tests, demos and benchmarks: it
generates deterministic text, labels itself (``x-simulator: vllm-sim`` header, ``owned_by:
"vllm-sim"``) and offers control endpoints under ``/sim``:

* ``POST /sim/faults`` (body: ``FaultSpec``) installs a fault; ``GET /sim/faults`` shows it.
* ``GET /sim/stats`` returns counters and the last inference request's headers and body.
* ``POST /sim/reset`` clears counters and the fault.

vLLM endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/tokenize``, ``/detokenize``, ``GET /health``, ``/metrics``, ``/version``.

A client disconnect during the time to first token, a hang or a stream cancels the request:
``running`` drops and ``cancelled`` counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from pydantic import ValidationError

from vllm_sim import metrics
from vllm_sim.config import FaultSpec, SimConfig
from vllm_sim.errors import (
    BadRequest,
    InvalidBody,
    MethodNotAllowed,
    RouteNotFound,
    SimError,
    error_body,
)
from vllm_sim.protocol import (
    Generation,
    embedding_inputs,
    parse_chat,
    parse_completion,
    prompt_length,
    resolve_model,
)
from vllm_sim.render import (
    chat_response,
    chat_stream,
    completion_response,
    completion_stream,
    dumps,
    embedding_response,
    models_response,
    new_id,
    total_completion_tokens,
)
from vllm_sim.state import SimState
from vllm_sim.tokens import message_text
from vllm_sim.wire import (
    Message,
    Receive,
    Send,
    SimulatedCrash,
    SseWriter,
    read_body,
    send_body,
    wait_disconnect,
)

Scope = dict[str, Any]
Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

INFERENCE = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})


class SimApp:
    """ASGI callable; build it with ``create_app``.

    Attributes:
        config: The immutable start-up configuration.
        state: Counters, the active fault and the tokenizer table of this app.
    """

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.state = SimState()
        self.created = int(time.time())
        self._routes: dict[str, dict[str, Handler]] = {
            "/health": {"GET": self._health},
            "/ping": {"GET": self._health},
            "/version": {"GET": self._version},
            "/metrics": {"GET": self._metrics},
            "/v1/models": {"GET": self._models},
            "/v1/chat/completions": {"POST": self._inference},
            "/v1/completions": {"POST": self._inference},
            "/v1/embeddings": {"POST": self._inference},
            "/tokenize": {"POST": self._tokenize},
            "/detokenize": {"POST": self._detokenize},
            "/sim/faults": {"POST": self._set_fault, "GET": self._get_fault},
            "/sim/stats": {"GET": self._stats},
            "/sim/reset": {"POST": self._reset},
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        methods = self._routes.get(path)
        try:
            if methods is None:
                raise RouteNotFound(f"Not Found: {path}")
            handler = methods.get(scope["method"])
            if handler is None:
                raise MethodNotAllowed(f"Method {scope['method']} not allowed on {path}")
        except SimError as exc:
            await send_body(send, exc.status, exc.body())
            return
        if not path.startswith("/sim/") and path not in INFERENCE:
            self.state.history.append(
                {"method": scope["method"], "path": path, "headers": _header_dict(scope)}
            )
        await handler(scope, receive, send)

    # -- plain endpoints -------------------------------------------------------------------

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        fault = self.state.take_fault(scope["path"])
        if fault is not None and fault.mode in ("status_500", "status_429"):
            await _send_fault_status(send, fault)
            return
        await send_body(send, 200, b"", content_type=None)

    async def _version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_body(send, 200, b'{"version":"vllm-sim"}')  # vLLM: its version string

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_body(send, 200, metrics.render(self.config, self.state), metrics.CONTENT_TYPE)

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        fault = self.state.take_fault(scope["path"])
        if fault is not None and fault.mode in ("status_500", "status_429"):
            await _send_fault_status(send, fault)
            return
        await send_body(send, 200, dumps(models_response(self.config, self.created)).encode())

    async def _tokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _json_or_error(receive, send)
        if body is None:
            return
        try:
            resolve_model(body, self.config)
            if isinstance(body.get("messages"), list):
                text = " ".join(
                    message_text(m.get("content")) for m in body["messages"] if isinstance(m, dict)
                )
            elif isinstance(body.get("prompt"), str):
                text = body["prompt"]
            else:
                raise BadRequest("'prompt' (string) or 'messages' is required", param="prompt")
        except SimError as exc:
            await send_body(send, exc.status, exc.body())
            return
        tokens = self.state.vocab.encode(text)
        doc = {
            "count": len(tokens),
            "max_model_len": self.config.max_model_len,
            "tokens": tokens,
            "token_strs": None,
        }
        await send_body(send, 200, dumps(doc).encode())

    async def _detokenize(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _json_or_error(receive, send)
        if body is None:
            return
        try:
            resolve_model(body, self.config)
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in tokens
            ):
                raise BadRequest("'tokens' must be a list of integers", param="tokens")
            try:
                text = self.state.vocab.decode(tokens)
            except ValueError as exc:
                raise BadRequest(str(exc), param="tokens") from exc
        except SimError as exc:
            await send_body(send, exc.status, exc.body())
            return
        await send_body(send, 200, dumps({"prompt": text}).encode())

    # -- control endpoints -----------------------------------------------------------------

    async def _set_fault(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _json_or_error(receive, send)
        if body is None:
            return
        try:
            spec = FaultSpec.model_validate(body)
        except ValidationError as exc:
            err = BadRequest(f"invalid fault: {exc.errors()[0]['msg']}", param="mode")
            await send_body(send, err.status, err.body())
            return
        self.state.set_fault(spec)
        await send_body(send, 200, dumps(spec.model_dump()).encode())

    async def _get_fault(self, scope: Scope, receive: Receive, send: Send) -> None:
        doc = {**self.state.fault.model_dump(), "remaining": self.state.fault_remaining}
        await send_body(send, 200, dumps(doc).encode())

    async def _stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_body(send, 200, dumps(self.state.stats()).encode())

    async def _reset(self, scope: Scope, receive: Receive, send: Send) -> None:
        await read_body(receive)
        self.state.reset()
        await send_body(send, 200, b'{"reset":true}')

    # -- inference -------------------------------------------------------------------------

    async def _inference(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        raw = await read_body(receive)
        if raw is None:
            return
        state = self.state
        state.received += 1
        try:
            body: Any = json.loads(raw) if raw else None
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = raw.decode("utf-8", "replace")
        state.record(scope["method"], path, _header_dict(scope), body)
        fault = state.take_fault(path)
        if fault is not None and fault.mode in ("status_500", "status_429"):
            state.errors += 1
            await _send_fault_status(send, fault)
            return
        try:
            if not isinstance(body, dict):
                raise InvalidBody("body: Input should be a valid dictionary", param="body")
            work, model = self._plan(path, body, send, fault)
        except SimError as exc:
            state.errors += 1
            await send_body(send, exc.status, exc.body())
            return
        state.running += 1
        state.running_by_model[model] += 1
        try:
            outcome = await _until_disconnect(receive, work)
        except SimulatedCrash:
            state.aborted += 1
            raise
        finally:
            state.running -= 1
            state.running_by_model[model] -= 1
        if outcome:
            state.completed += 1
        else:
            # like vLLM 0.32: a client abort is not counted in vllm:request_success_total
            state.cancelled += 1

    def _plan(
        self, path: str, body: dict[str, Any], send: Send, fault: FaultSpec | None
    ) -> tuple[Coroutine[Any, Any, None], str]:
        """Validate the request and return the coroutine that answers it, and its model."""
        if fault is not None and fault.mode == "hang":
            return _hang(), resolve_model(body, self.config)
        if path == "/v1/chat/completions":
            gen = parse_chat(body, self.config)
            return self._generate(gen, None, False, send, fault), gen.model
        if path == "/v1/completions":
            gen, prompts = parse_completion(body, self.config)
            echo = bool(body.get("echo", False))
            return self._generate(gen, prompts, echo, send, fault), gen.model
        model = resolve_model(body, self.config)
        inputs = embedding_inputs(body)
        fmt = body.get("encoding_format", "float")
        if fmt not in ("float", "base64"):
            raise BadRequest("encoding_format must be 'float' or 'base64'", param="encoding_format")
        if max(prompt_length(i) for i in inputs) > self.config.max_model_len:
            raise BadRequest(
                f"This model's maximum context length is {self.config.max_model_len} tokens. "
                "However, you requested more tokens in the input for embedding generation. "
                "Please reduce the length of the input.",
                param="input",
            )
        return self._embed(model, inputs, fmt == "base64", send, fault), model

    async def _generate(
        self,
        gen: Generation,
        prompts: list[str | list[int]] | None,
        echo: bool,
        send: Send,
        fault: FaultSpec | None,
    ) -> None:
        cfg = self.config
        created = int(time.time())
        if cfg.ttft_s:
            await asyncio.sleep(cfg.ttft_s)
        if prompts is None:
            rid = new_id("chatcmpl")
        else:
            rid = new_id("cmpl")
        if gen.stream:
            writer = SseWriter(send, fault)
            await writer.start()
            if prompts is None:
                events = chat_stream(gen, rid, created)
                undelayed = 2 * gen.n  # role events and the first token of each choice
            else:
                events = completion_stream(gen, prompts, rid, created)
                undelayed = gen.n
            itl = cfg.itl_s
            # the usage event follows the last token at once (vLLM sends it in the same step)
            delayed_until = 1 << 62
            if gen.include_usage:
                delayed_until = _count_events(gen, prompts) - 1
            for k, payload in enumerate(events):
                if itl and undelayed <= k < delayed_until:
                    await asyncio.sleep(itl)
                await writer.event(payload)
            await writer.finish()
        else:
            if prompts is None:
                doc = chat_response(gen, rid, created)
            else:
                doc = completion_response(gen, prompts, rid, created, echo)
            tokens = total_completion_tokens(gen, len(prompts or [None]))
            if cfg.itl_s:
                await asyncio.sleep(cfg.itl_s * max(tokens - 1, 0))
            await send_body(send, 200, dumps(doc).encode(), fault=fault)
        state = self.state
        state.prompt_tokens_total[gen.model] += gen.prompt_tokens
        state.generation_tokens_total[gen.model] += total_completion_tokens(
            gen, len(prompts or [None])
        )
        reason = "stop" if gen.finish_reason == "tool_calls" else gen.finish_reason
        state.success_total[(gen.model, reason)] += gen.n

    async def _embed(
        self,
        model: str,
        inputs: list[str | list[int]],
        base64_format: bool,
        send: Send,
        fault: FaultSpec | None,
    ) -> None:
        if self.config.ttft_s:
            await asyncio.sleep(self.config.ttft_s)
        tokens = sum(prompt_length(i) for i in inputs)
        doc = embedding_response(
            model, inputs, self.config.embedding_dim, base64_format, tokens, int(time.time())
        )
        self.state.prompt_tokens_total[model] += tokens
        await send_body(send, 200, dumps(doc).encode(), fault=fault)


def create_app(config: SimConfig | None = None) -> SimApp:
    """Build a simulator app.

    Args:
        config: Served models, timings and sizes; defaults to ``SimConfig()``.

    Returns:
        An ASGI 3 application (serve it with uvicorn).
    """
    return SimApp(config or SimConfig())


async def _until_disconnect(receive: Receive, work: Coroutine[Any, Any, None]) -> bool:
    """Run ``work`` until it finishes (True) or the client disconnects (False, work cancelled).

    Raises:
        SimulatedCrash: re-raised from ``work`` so that uvicorn drops the connection.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task.done():
        watcher.cancel()
        task.result()
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False


def _count_events(gen: Generation, prompts: list[str | list[int]] | None) -> int:
    """Number of JSON events of a stream (without ``[DONE]``)."""
    usage = 1 if gen.include_usage else 0
    if prompts is not None:
        return gen.completion_tokens * gen.n * len(prompts) + usage
    if gen.tool is not None:
        return (total_completion_tokens(gen) // gen.n + 1) * gen.n + usage
    return (1 + gen.completion_tokens) * gen.n + usage


async def _hang() -> None:
    """Never answer (fault ``hang``); ends only by cancellation when the client goes."""
    await asyncio.Event().wait()


async def _json_or_error(receive: Receive, send: Send) -> dict[str, Any] | None:
    raw = await read_body(receive)
    if raw is None:
        return None
    try:
        body = json.loads(raw) if raw else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        err = InvalidBody(f"body: JSON decode error: {exc}", param="body")
        await send_body(send, err.status, err.body())
        return None
    if not isinstance(body, dict):
        err = InvalidBody("body: Input should be a valid dictionary", param="body")
        await send_body(send, err.status, err.body())
        return None
    return body


async def _send_fault_status(send: Send, fault: FaultSpec) -> None:
    if fault.mode == "status_429":
        body = error_body("simulated rate limit (vllm-sim fault status_429)", "RateLimitError", 429)
        extra = [(b"retry-after", str(fault.retry_after_s).encode())]
        await send_body(send, 429, body, extra=extra)
    else:
        body = error_body(
            "simulated internal error (vllm-sim fault status_500)", "InternalServerError", 500
        )
        await send_body(send, 500, body)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _header_dict(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in scope["headers"]:
        out[key.decode("latin-1").lower()] = value.decode("latin-1")
    return out
