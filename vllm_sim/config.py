"""Configuration of the vLLM simulator: the served models, timing, sizes and fault modes.

``SimConfig`` is fixed when the app is built (``create_app(SimConfig(...))``); ``FaultSpec`` is
the body of ``POST /sim/faults`` and can change while the simulator runs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from vllm_sim.waiting import SchedulingPolicy

FaultMode = Literal[
    "none", "status_500", "status_429", "hang", "die_mid_stream", "split_writes", "crlf"
]
"""Fault modes of the simulator.

* ``none``: behave like a healthy vLLM server.
* ``status_500``: answer 500 with an OpenAI-shaped error body.
* ``status_429``: answer 429 with ``Retry-After: <retry_after_s>`` and an error body.
* ``hang``: accept the request and never send a byte (a client disconnect counts as cancelled).
* ``die_mid_stream``: after ``after_events`` SSE events, abort the connection without the
  terminating chunk (a non-streamed response is cut after half of its body).
* ``split_writes``: write every SSE event in several small pieces, cut inside ``data:``, inside
  the JSON and inside a multi-byte UTF-8 character.
* ``crlf``: frame SSE events with ``\\r\\n`` line endings (allowed by the SSE specification).
"""

INFERENCE_PATHS: tuple[str, ...] = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
"""Paths a fault applies to unless ``FaultSpec.paths`` names others."""


class KVEventsConfig(BaseModel):
    """vLLM's ``--kv-events-config`` (the fields the simulator uses; same names as vLLM's).

    Attributes:
        enable_kv_cache_events: Publish the prefix cache's events.
        publisher: ``zmq`` (vLLM's ``null`` publishes nothing).
        endpoint: PUB address to bind, e.g. ``tcp://127.0.0.1:5557``.
        replay_endpoint: ROUTER address to bind for replay, or None.
        topic: Topic frame of every message.
        buffer_steps: Batches kept for replay.
        layout: ``map`` (vLLM >= 0.12's encoding) or ``array`` (vLLM <= 0.11's); simulator only.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = Field(default=10_000, ge=1)
    layout: Literal["map", "array"] = "map"


class SimConfig(BaseModel):
    """Start-up configuration of one simulator app (immutable).

    Attributes:
        models: Served model names (``GET /v1/models``); the first one is the default model.
        ttft_s: Time to first token in seconds (delay before the first byte of a response).
        itl_s: Inter-token latency in seconds (delay between two generated tokens of a stream).
        tokens_per_response: Tokens generated per choice when ``max_tokens`` does not cut it short
            (finish_reason ``stop``; ``length`` when ``max_tokens`` is smaller).
        embedding_dim: Length of each embedding vector.
        max_model_len: Context length in tokens; a prompt plus ``max_tokens`` above it is a 400.
        profile: Opt-in performance model (:mod:`vllm_sim.engine`): a shipped profile name
            (:data:`vllm_sim.profiles.PROFILES`) or the path of a profile JSON file (ends in
            ``.json``). ``None`` keeps the fixed ``ttft_s``/``itl_s`` pacing.
        time_scale: With a profile: wall-clock seconds per model second (2.0 = half speed).
        num_gpu_blocks: With a profile: override its KV-cache size in blocks (like vLLM's
            ``--num-gpu-blocks-override``).
        kv_events: With a profile: publish the prefix cache's KV events (vLLM's
            ``--kv-events-config``, :mod:`vllm_sim.kv_events`).
        scheduling_policy: vLLM's ``--scheduling-policy`` (``fcfs`` or ``priority``): the order
            of the engine's waiting queue (:mod:`vllm_sim.waiting`). A request with a non-zero
            ``priority`` is refused (400) unless it is ``priority``, as vLLM refuses it.
            ``None``: the profile's (``fcfs`` without a profile).
        long_prefill_token_threshold: With a profile: vLLM's
            ``--long-prefill-token-threshold``, the prompt tokens one request may prefill per
            engine step (0: no cap). ``None``: the profile's.
        auto_tool_calls: A request with ``tools`` and ``tool_choice`` ``auto`` (or absent) is
            answered with a call of its first tool, as an agent's model would, unless the last
            message is a tool result (then text: the agent loop ends). Off: ``auto`` answers
            text, as before.
        api_key: vLLM's ``--api-key``: every ``/v1`` request must carry
            ``Authorization: Bearer <api_key>`` or is answered 401 ``{"error": "Unauthorized"}``
            (vLLM's authentication middleware; ``/health``, ``/metrics`` and the ``/sim``
            controls stay open, as vLLM's non-``/v1`` routes do). ``None``: no key.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    models: list[str] = Field(default_factory=lambda: ["sim-model"], min_length=1)
    ttft_s: float = Field(default=0.0, ge=0.0)
    itl_s: float = Field(default=0.0, ge=0.0)
    tokens_per_response: int = Field(default=16, ge=1)
    embedding_dim: int = Field(default=8, ge=1)
    max_model_len: int = Field(default=2048, ge=1)
    profile: str | None = None
    time_scale: float = Field(default=1.0, gt=0.0)
    num_gpu_blocks: int | None = Field(default=None, ge=1)
    kv_events: KVEventsConfig | None = None
    scheduling_policy: SchedulingPolicy | None = None
    long_prefill_token_threshold: int | None = Field(default=None, ge=0)
    auto_tool_calls: bool = False
    api_key: str | None = Field(default=None, min_length=1)


class FaultSpec(BaseModel):
    """Body of ``POST /sim/faults``.

    Attributes:
        mode: The fault to inject (see ``FaultMode``).
        retry_after_s: Value of the ``Retry-After`` header in seconds (``status_429``).
        after_events: SSE events sent before the connection dies (``die_mid_stream``).
        count: Number of matching requests the fault applies to; ``None`` means all of them.
            The fault switches itself off (mode ``none``) when the count is used up.
        paths: Request paths the fault applies to; ``None`` means the inference endpoints
            (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``).
        split_delay_s: Pause between the pieces of one event in ``split_writes`` mode, so that
            the pieces reach the client in separate reads.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: FaultMode = "none"
    retry_after_s: int = Field(default=1, ge=0)
    after_events: int = Field(default=3, ge=0)
    count: int | None = Field(default=None, ge=1)
    paths: list[str] | None = None
    split_delay_s: float = Field(default=0.001, ge=0.0, le=1.0)

    def applies_to(self, path: str) -> bool:
        """Return True when this fault is active for a request to ``path``."""
        if self.mode == "none":
            return False
        return path in (self.paths if self.paths is not None else INFERENCE_PATHS)
