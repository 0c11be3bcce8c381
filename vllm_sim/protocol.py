"""Validation of OpenAI-compatible request bodies into the parameters the simulator needs.

Field names and defaults follow vLLM's OpenAI-compatible server: ``max_tokens`` defaults to the
rest of the context for chat and to 16 for completions; ``stream_options`` requires
``stream: true``; a prompt plus ``max_tokens`` beyond ``max_model_len`` is a 400.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_sim.config import SimConfig
from vllm_sim.errors import BadRequest, InvalidBody, ModelNotFound
from vllm_sim.tokens import count_text, message_text
from vllm_sim.waiting import SchedulingPolicy

COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class Generation:
    """What to generate: shared by chat and completions.

    Attributes:
        model: Served model name.
        stream: Answer as Server-Sent Events.
        include_usage: ``stream_options.include_usage``: a final ``choices: []`` usage event.
        continuous_usage: ``stream_options.continuous_usage_stats``: usage on every event.
        n: Choices per prompt.
        prompt_tokens: Approximate prompt length in tokens (per prompt).
        completion_tokens: Tokens generated per choice.
        finish_reason: ``stop`` or ``length``.
        json_mode: ``response_format`` asks for JSON: the content is a JSON object.
        tool: The ``tools[]`` entry to call (tool_choice named or "required"), else None.
        priority: The body's ``priority`` (default 0; lower is scheduled first under vLLM's
            ``--scheduling-policy priority``).
    """

    model: str
    stream: bool
    include_usage: bool
    continuous_usage: bool
    n: int
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    json_mode: bool = False
    tool: dict[str, Any] | None = None
    priority: int = 0


def parse_priority(body: dict[str, Any], policy: SchedulingPolicy) -> int:
    """The body's ``priority`` (vLLM's extra sampling field, default 0).

    Raises:
        InvalidBody: Not an integer.
        BadRequest: Non-zero while the engine runs ``fcfs`` (vLLM's input processor refuses
            it: "Got priority N but Priority scheduling is not enabled.").
    """
    value = body.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidBody("body.priority: Input should be a valid integer", param="body.priority")
    if value != 0 and policy != "priority":
        raise BadRequest(f"Got priority {value} but Priority scheduling is not enabled.")
    return value


def resolve_model(body: dict[str, Any], config: SimConfig) -> str:
    """The served model a request names (the first served model when ``model`` is absent).

    Raises:
        BadRequest: ``model`` is not a string.
        ModelNotFound: the model is not served.
    """
    model = body.get("model")
    if model is None:
        return config.models[0]
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    if model not in config.models:
        raise ModelNotFound(model, config.models)
    return model


def _int_field(body: dict[str, Any], name: str, default: int | None, minimum: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidBody(f"body.{name}: Input should be a valid integer", param=f"body.{name}")
    if value < minimum:
        raise BadRequest(f"{name} must be at least {minimum}, got {value}.")
    return value


def _stream_flags(body: dict[str, Any]) -> tuple[bool, bool, bool]:
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    opts = body.get("stream_options")
    if opts is not None:
        if not stream:
            raise BadRequest(
                "Stream options can only be defined when `stream=True`. "
                "(parameter=stream_options)",
                param="stream_options",
            )
        if not isinstance(opts, dict):
            raise BadRequest("'stream_options' must be an object", param="stream_options")
    opts = opts or {}
    include_usage = bool(opts.get("include_usage", False))
    continuous = bool(opts.get("continuous_usage_stats", False))
    return stream, include_usage, continuous


def _sampling_checks(body: dict[str, Any]) -> None:
    temperature = body.get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, int | float):
            raise BadRequest("'temperature' must be a number", param="temperature")
        if temperature < 0:
            raise BadRequest(
                f"temperature must be non-negative, got {float(temperature)}. "
                f"(parameter=temperature, value={float(temperature)})",
                param="temperature",
            )
    top_p = body.get("top_p")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1
    ):
        raise BadRequest(f"top_p must be in (0, 1], got {top_p}.", param="top_p")


def _budget(config: SimConfig, prompt_tokens: int, max_tokens: int | None) -> tuple[int, str]:
    """Tokens to generate per choice and the finish reason.

    Like vLLM 0.32: a prompt longer than the context or ``max_tokens`` above it is a 400; a
    ``max_tokens`` that fits the context alone but not after the prompt is clamped.
    """
    limit = config.max_model_len
    if prompt_tokens > limit:
        raise BadRequest(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains at least {prompt_tokens} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={prompt_tokens})",
            param="input_tokens",
        )
    if max_tokens is not None and max_tokens > limit:
        raise BadRequest(
            f"max_tokens={max_tokens} cannot be greater than max_model_len={limit}. Please "
            f"request fewer output tokens. (parameter=max_tokens, value={max_tokens})",
            param="max_tokens",
        )
    room = max(limit - prompt_tokens, 1)
    budget = room if max_tokens is None else min(max_tokens, room)
    if budget < config.tokens_per_response:
        return budget, "length"
    return config.tokens_per_response, "stop"


def _pick_tool(body: dict[str, Any], auto_calls: bool = False) -> dict[str, Any] | None:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be a list", param="tools")
    tools = tools or []
    if choice == "required":
        if not tools:
            raise BadRequest("tool_choice 'required' needs 'tools'", param="tool_choice")
        return dict(tools[0])
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        for tool in tools:
            if isinstance(tool, dict) and (tool.get("function") or {}).get("name") == name:
                return dict(tool)
        raise BadRequest(f"Tool '{name}' has not been passed in `tools`.", param="tool_choice")
    if choice not in (None, "auto", "none"):
        raise BadRequest(f"invalid tool_choice {choice!r}", param="tool_choice")
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    answered = isinstance(last, dict) and last.get("role") == "tool"
    if auto_calls and choice != "none" and tools and not answered:
        return dict(tools[0])
    return None


def parse_chat(body: dict[str, Any], config: SimConfig,
               policy: SchedulingPolicy = "fcfs") -> Generation:
    """Validate a ``/v1/chat/completions`` body.

    Args:
        body: The JSON body.
        config: The simulator's configuration.
        policy: The engine's scheduling policy (checks ``priority``, :func:`parse_priority`).

    Raises:
        BadRequest: invalid field or prompt too long.
        ModelNotFound: unknown model.
    """
    model = resolve_model(body, config)
    messages = body.get("messages")
    if messages is None:
        raise InvalidBody("body.messages: Field required", param="body.messages")
    if not isinstance(messages, list):
        raise InvalidBody("body.messages: Input should be a valid list", param="body.messages")
    if not messages:
        raise BadRequest(
            "Cannot apply chat template to an empty conversation. "
            "Provide at least one message."
        )
    prompt_tokens = 0
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest("each message needs a string 'role'", param="messages")
        prompt_tokens += count_text(message_text(msg.get("content")))
    stream, include_usage, continuous = _stream_flags(body)
    _sampling_checks(body)
    n = _int_field(body, "n", 1, 1) or 1
    max_tokens = _int_field(body, "max_completion_tokens", None, 1)
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", None, 1)
    completion_tokens, finish = _budget(config, prompt_tokens, max_tokens)
    fmt = body.get("response_format")
    json_mode = isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")
    tool = _pick_tool(body, config.auto_tool_calls)
    return Generation(
        model=model,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        n=n,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        finish_reason="tool_calls" if tool is not None else finish,
        json_mode=json_mode,
        tool=tool,
        priority=parse_priority(body, policy),
    )


def completion_prompts(body: dict[str, Any]) -> list[str | list[int]]:
    """The prompts of a ``/v1/completions`` body (string, token ids, or lists of either).

    Raises:
        BadRequest: ``prompt`` is missing or of the wrong type.
    """
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return [list(prompt)]
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
            return [list(p) for p in prompt]
    raise BadRequest(
        "'prompt' must be a string, a list of strings or a list of token ids", param="prompt"
    )


def prompt_length(prompt: str | list[int]) -> int:
    """Token count of one completion prompt."""
    return count_text(prompt) if isinstance(prompt, str) else len(prompt)


def parse_completion(
    body: dict[str, Any], config: SimConfig, policy: SchedulingPolicy = "fcfs"
) -> tuple[Generation, list[str | list[int]]]:
    """Validate a ``/v1/completions`` body; returns the generation and the prompts.

    Args:
        body: The JSON body.
        config: The simulator's configuration.
        policy: The engine's scheduling policy (checks ``priority``, :func:`parse_priority`).

    Raises:
        BadRequest: invalid field or prompt too long.
        ModelNotFound: unknown model.
    """
    model = resolve_model(body, config)
    prompts = completion_prompts(body)
    stream, include_usage, continuous = _stream_flags(body)
    _sampling_checks(body)
    n = _int_field(body, "n", 1, 1) or 1
    max_tokens = _int_field(body, "max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS, 1)
    longest = max(prompt_length(p) for p in prompts)
    completion_tokens, finish = _budget(config, longest, max_tokens)
    gen = Generation(
        model=model,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        n=n,
        prompt_tokens=sum(prompt_length(p) for p in prompts),
        completion_tokens=completion_tokens,
        finish_reason=finish,
        priority=parse_priority(body, policy),
    )
    return gen, prompts


def embedding_inputs(body: dict[str, Any]) -> list[str | list[int]]:
    """The inputs of a ``/v1/embeddings`` body (same shapes as a completion prompt).

    Raises:
        BadRequest: ``input`` is missing or of the wrong type.
    """
    try:
        return completion_prompts({"prompt": body.get("input")})
    except BadRequest:
        raise BadRequest(
            "'input' must be a string, a list of strings or a list of token ids", param="input"
        ) from None
