"""The vLLM simulator as a raw ASGI application (``create_app(SimConfig) -> SimApp``).

This is a SIMULATOR of vLLM's OpenAI-compatible server for tests, demos and benchmarks: it
generates deterministic text, labels itself (``x-simulator: vllm-sim`` header, ``owned_by:
"vllm-sim"``) and offers control endpoints under ``/sim``:

* ``POST /sim/faults`` (body: ``FaultSpec``) installs a fault; ``GET /sim/faults`` shows it.
* ``GET /sim/stats`` returns counters and the last inference request's headers and body.
* ``POST /sim/reset`` clears counters and the fault (and, with a profile, the prefix cache).
* ``POST /sim/prefix`` (body: a chat or completions request; needs a profile) answers
  ``{"cached_tokens", "prompt_tokens"}``: what the prefix cache holds of that prompt now (the
  oracle of ``bench/routing.py``).

With ``SimConfig.profile`` the engine model of :mod:`vllm_sim.engine` paces generation
(continuous batching, a waiting queue, a paged KV cache with prefix caching) and ``/metrics``
reports its queue, KV usage and prefix-cache counters.

vLLM endpoints: ``GET /v1/models``, ``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, ``/tokenize``, ``/detokenize``, ``GET /health``, ``/metrics``, ``/version``.

A client disconnect during the time to first token, a hang or a stream cancels the request:
``running`` drops and ``cancelled`` counts it.
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from pydantic import ValidationError

from vllm_sim import metrics, perf
from vllm_sim.config import FaultSpec, SimConfig
from vllm_sim.engine import Engine
from vllm_sim.errors import (
    BadRequest,
    InvalidBody,
    MethodNotAllowed,
    RouteNotFound,
    SimError,
    error_body,
)
from vllm_sim.inference import embed, generate, hang, until_disconnect
from vllm_sim.kv_events import KVEventPublisher
from vllm_sim.prompt import chat_text, completion_text, prompt_pieces
from vllm_sim.protocol import (
    embedding_inputs,
    parse_chat,
    parse_completion,
    prompt_length,
    resolve_model,
)
from vllm_sim.render import (
    dumps,
    models_response,
)
from vllm_sim.state import SimState
from vllm_sim.tokens import message_text, piece_ids
from vllm_sim.waiting import SchedulingPolicy
from vllm_sim.wire import (
    Message,
    Receive,
    Send,
    SimulatedCrash,
    read_body,
    send_body,
)

Scope = dict[str, Any]
Handler = Callable[[Scope, Receive, Send], Awaitable[None]]

INFERENCE = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})


class SimApp:
    """ASGI callable; build it with ``create_app``.

    Attributes:
        config: The immutable start-up configuration.
        state: Counters, the active fault and the tokenizer table of this app.
        engine: The engine model when ``config.profile`` is set, else ``None``.
        policy: The scheduling policy in effect (the profile's unless the config names one).
    """

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self._bearer = None if config.api_key is None else b"Bearer " + config.api_key.encode()
        self.state = SimState()
        self.engine = perf.engine_for(config)
        # vLLM's --scheduling-policy: orders the engine's queue, decides whether a request's
        # ``priority`` is accepted (also without a profile, where nothing is queued).
        self.policy: SchedulingPolicy = (
            self.engine.profile.scheduling_policy if self.engine is not None
            else config.scheduling_policy or "fcfs")
        self.kv_events: KVEventPublisher | None = None
        ev = config.kv_events
        if (self.engine is not None and ev is not None and ev.enable_kv_cache_events
                and ev.publisher == "zmq"):
            self.kv_events = KVEventPublisher(ev.endpoint, ev.replay_endpoint, ev.topic,
                                              ev.layout, ev.buffer_steps)
            self.engine.publish = self.kv_events.publish
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
            "/sim/prefix": {"POST": self._prefix},
            "/sim/kv_events/drop": {"POST": self._drop_events},
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, self.engine, self.kv_events)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if self._bearer is not None and path.startswith("/v1") and \
                scope["method"] != "OPTIONS" and not _has_bearer(scope, self._bearer):
            await send_body(send, 401, b'{"error":"Unauthorized"}')
            return
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
        fault = self.state.take_fault(scope["path"])
        if fault is not None and fault.mode in ("status_500", "status_429"):
            await _send_fault_status(send, fault)
            return
        page = metrics.render(self.config, self.state, self.engine)
        await send_body(send, 200, page, metrics.CONTENT_TYPE)

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
        if self.kv_events is not None:
            # With KV events on, the ids the engine and its events use: the chat rendering
            # (with the generation prompt, as vLLM's TokenizeChatRequest) in piece ids.
            rendered = (chat_text(body) if isinstance(body.get("messages"), list)
                        else completion_text([body["prompt"]]))
            tokens = piece_ids(prompt_pieces(rendered))
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
        doc = self.state.stats()
        if self.engine is not None:
            doc["engine"] = perf.engine_stats(self.engine)
        if self.kv_events is not None:
            doc["kv_events"] = self.kv_events.describe()
        await send_body(send, 200, dumps(doc).encode())

    async def _reset(self, scope: Scope, receive: Receive, send: Send) -> None:
        await read_body(receive)
        self.state.reset()
        if self.engine is not None:
            self.engine.reset_cache()
        await send_body(send, 200, b'{"reset":true}')

    async def _drop_events(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /sim/kv_events/drop {"count": n}``: the next n event batches skip the PUB
        socket (a sequence gap; the replay buffer keeps them)."""
        body = await _json_or_error(receive, send)
        if body is None:
            return
        count = body.get("count")
        if self.kv_events is None or not isinstance(count, int) or count < 0:
            await send_body(send, 400, b'{"error":"kv events off, or count not an int >= 0"}')
            return
        self.kv_events.drop_next(count)
        await send_body(send, 200, dumps({"dropping": count}).encode())

    async def _prefix(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await _json_or_error(receive, send)
        if body is None:
            return
        try:
            doc = perf.prefix_probe(self.engine, body, self.config)
        except SimError as exc:
            await send_body(send, exc.status, exc.body())
            return
        await send_body(send, 200, dumps(doc).encode())

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
            outcome = await until_disconnect(receive, work)
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
            return hang(), resolve_model(body, self.config)
        if path == "/v1/chat/completions":
            gen = parse_chat(body, self.config, self.policy)
            prompt = chat_text(body)
            pacer = perf.pacer(self.engine, gen, prompt, lambda a: chat_text(body, a), 1)
            work = generate(self.config, self.state, gen, None, False, send, fault, pacer)
            return work, gen.model
        if path == "/v1/completions":
            gen, prompts = parse_completion(body, self.config, self.policy)
            echo = bool(body.get("echo", False))
            text = completion_text(prompts)
            pacer = perf.pacer(self.engine, gen, text, lambda a: text + a, len(prompts),
                               perf.single_token_prompt(prompts))
            work = generate(self.config, self.state, gen, prompts, echo, send, fault, pacer)
            return work, gen.model
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
        work = embed(self.config, self.state, model, inputs, fmt == "base64", send, fault)
        return work, model


def _has_bearer(scope: Scope, expected: bytes) -> bool:
    """Whether the request's ``Authorization`` header is ``Bearer <key>`` for the expected
    ``Bearer <key>`` bytes (compared in constant time, as vLLM compares it)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return hmac.compare_digest(value, expected)
    return False


def create_app(config: SimConfig | None = None) -> SimApp:
    """Build a simulator app.

    Args:
        config: Served models, timings and sizes; defaults to ``SimConfig()``.

    Returns:
        An ASGI 3 application (serve it with uvicorn).
    """
    return SimApp(config or SimConfig())


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


async def _lifespan(receive: Receive, send: Send, engine: Engine | None,
                    kv_events: KVEventPublisher | None) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "lifespan.startup":
            if kv_events is not None:
                kv_events.start()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if engine is not None:
                await engine.close()
            if kv_events is not None:
                await kv_events.close()
            await send({"type": "lifespan.shutdown.complete"})
            return


def _header_dict(scope: Scope) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in scope["headers"]:
        out[key.decode("latin-1").lower()] = value.decode("latin-1")
    return out
