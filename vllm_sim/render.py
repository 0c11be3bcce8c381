"""Response bodies and stream events in vLLM's OpenAI-compatible shapes.

Objects: ``chat.completion``, ``chat.completion.chunk``, ``text_completion`` (also its stream
chunks), ``list`` of ``embedding``, ``list`` of ``model``. Stream events are produced as compact
JSON strings from precomputed prefixes (no per-event model serialisation) so that the simulator
outruns the gateway in benchmarks. A chat stream starts with one ``delta.role`` event per
choice; the event carrying a choice's last token also carries its ``finish_reason``; with
``include_usage`` a final event has ``"choices": []`` and ``usage``. ``[DONE]`` is added by the
writer.
"""

from __future__ import annotations

import base64
import json
import struct
import uuid
from collections.abc import Iterator
from typing import Any

from vllm_sim.config import SimConfig
from vllm_sim.protocol import Generation
from vllm_sim.tokens import (
    OUTPUT_TOKENS,
    embedding,
    fragments,
    json_tokens,
    output_tokens,
    tool_arguments,
)

_TOKEN_JSON: dict[str, str] = {
    t: json.dumps(t, ensure_ascii=False) for t in (*OUTPUT_TOKENS, '{"text": "', '"}', "{}")
}


def dumps(obj: Any) -> str:
    """Compact JSON with raw UTF-8 (like pydantic's ``model_dump_json``)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _tok(t: str) -> str:
    cached = _TOKEN_JSON.get(t)
    return cached if cached is not None else dumps(t)


FINGERPRINT = "vllm-sim"
"""``system_fingerprint`` of every response (vLLM sends ``vllm-<version>-<hash>``)."""


def new_id(prefix: str) -> str:
    """A fresh response id such as ``chatcmpl-<16 hex>`` (vLLM's format)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def usage(prompt: int, completion: int) -> dict[str, Any]:
    """The ``usage`` object of a non-streamed response."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def stream_usage(prompt: int, completion: int) -> dict[str, Any]:
    """The ``usage`` object of the final stream event (vLLM omits the details there)."""
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
            "completion_tokens": completion}


def _usage_event(obj: str, gen: Generation, rid: str, created: int, done: int) -> str:
    return dumps(
        {
            "id": rid,
            "object": obj,
            "created": created,
            "model": gen.model,
            "choices": [],
            "usage": stream_usage(gen.prompt_tokens, done),
            "system_fingerprint": FINGERPRINT,
        }
    )


def choice_tokens(gen: Generation, index: int) -> list[str]:
    """Generated tokens of choice ``index``."""
    if gen.json_mode:
        return json_tokens(gen.completion_tokens, index)
    return output_tokens(gen.completion_tokens, index)


def _tool_call_parts(gen: Generation) -> tuple[str, list[str]]:
    assert gen.tool is not None
    name = str(gen.tool.get("function", {}).get("name", ""))
    return name, fragments(tool_arguments(gen.tool))


def total_completion_tokens(gen: Generation, prompts: int = 1) -> int:
    """Completion tokens over all choices (tool calls count one token per fragment plus one)."""
    if gen.tool is not None:
        return (len(_tool_call_parts(gen)[1]) + 1) * gen.n
    return gen.completion_tokens * gen.n * prompts


def chat_response(gen: Generation, rid: str, created: int) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` object."""
    choices = []
    for i in range(gen.n):
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if gen.tool is not None:
            name, parts = _tool_call_parts(gen)
            message["tool_calls"] = [
                {
                    "id": new_id("chatcmpl-tool"),
                    "type": "function",
                    "function": {"name": name, "arguments": "".join(parts)},
                }
            ]
        else:
            message["content"] = "".join(choice_tokens(gen, i))
        message["reasoning"] = None
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": None,
                "finish_reason": gen.finish_reason,
                "stop_reason": None,
                "token_ids": None,
            }
        )
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": gen.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": FINGERPRINT,
        "usage": usage(gen.prompt_tokens, total_completion_tokens(gen)),
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
    }


def chat_stream(gen: Generation, rid: str, created: int) -> Iterator[str]:
    """The JSON payloads of a chat stream, without the final ``[DONE]``."""
    head = (
        f'{{"id":"{rid}","object":"chat.completion.chunk","created":{created},'
        f'"model":{dumps(gen.model)},"choices":[{{"index":'
    )
    if gen.continuous_usage:
        yield from _chat_stream_slow(gen, rid, created)
        return
    for i in range(gen.n):
        yield (
            f'{head}{i},"delta":{{"role":"assistant","content":""}},'
            f'"logprobs":null,"finish_reason":null}}],"prompt_token_ids":null,"prompt_text":null}}'
        )
    if gen.tool is not None:
        # vLLM 0.32 (named tool_choice): name first (no arguments key), then argument
        # fragments, then an empty delta carrying the finish reason.
        name, parts = _tool_call_parts(gen)
        for i in range(gen.n):
            call = {
                "id": new_id("chatcmpl-tool"),
                "type": "function",
                "index": 0,
                "function": {"name": name},
            }
            yield (
                f'{head}{i},"delta":{{"content":null,"tool_calls":[{dumps(call)}]}},'
                f'"logprobs":null,"finish_reason":null,"token_ids":null}}]}}'
            )
        for frag in parts:
            for i in range(gen.n):
                yield (
                    f'{head}{i},"delta":{{"content":null,"tool_calls":[{{"index":0,"function":'
                    f'{{"arguments":{dumps(frag)}}}}}]}},"logprobs":null,"finish_reason":null,'
                    f'"token_ids":null}}]}}'
                )
        for i in range(gen.n):
            yield (
                f'{head}{i},"delta":{{}},"logprobs":null,"finish_reason":"tool_calls",'
                f'"stop_reason":null,"token_ids":null}}],"system_fingerprint":"{FINGERPRINT}"}}'
            )
    else:
        tokens = [choice_tokens(gen, i) for i in range(gen.n)]
        last = gen.completion_tokens - 1
        fin_last = f'{dumps(gen.finish_reason)},"stop_reason":null'
        for step in range(gen.completion_tokens):
            fin = fin_last if step == last else "null"
            for i in range(gen.n):
                yield (
                    f'{head}{i},"delta":{{"content":{_tok(tokens[i][step])}}},'
                    f'"logprobs":null,"finish_reason":{fin},"token_ids":null}}]}}'
                )
    if gen.include_usage:
        yield _usage_event("chat.completion.chunk", gen, rid, created, total_completion_tokens(gen))


def _chunk(gen: Generation, rid: str, created: int, choice: dict[str, Any], done: int) -> str:
    return dumps(
        {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": gen.model,
            "choices": [choice],
            "usage": {**stream_usage(gen.prompt_tokens, done), "completion_tokens_details": None},
        }
    )


def _chat_stream_slow(gen: Generation, rid: str, created: int) -> Iterator[str]:
    """Chat stream with ``continuous_usage_stats``: usage on every event (tool calls as text)."""
    done = 0
    for i in range(gen.n):
        delta = {"role": "assistant", "content": ""}
        choice = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
        yield _chunk(gen, rid, created, choice, done)
    tokens = [choice_tokens(gen, i) for i in range(gen.n)]
    for step in range(gen.completion_tokens):
        last = step == gen.completion_tokens - 1
        for i in range(gen.n):
            done += 1
            choice = {
                "index": i,
                "delta": {"content": tokens[i][step]},
                "logprobs": None,
                "finish_reason": gen.finish_reason if last else None,
            }
            if last:
                choice["stop_reason"] = None
            choice["token_ids"] = None
            yield _chunk(gen, rid, created, choice, done)
    if gen.include_usage:
        yield _usage_event("chat.completion.chunk", gen, rid, created, done)


def completion_response(
    gen: Generation, prompts: list[str | list[int]], rid: str, created: int, echo: bool
) -> dict[str, Any]:
    """A non-streamed ``text_completion`` object (choices ordered prompt-major)."""
    choices = []
    for p_idx, prompt in enumerate(prompts):
        for j in range(gen.n):
            index = p_idx * gen.n + j
            text = "".join(output_tokens(gen.completion_tokens, index))
            if echo and isinstance(prompt, str):
                text = prompt + text
            choices.append(
                {
                    "index": index,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": gen.finish_reason,
                    "stop_reason": None,
                    "token_ids": None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": None,
                }
            )
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": gen.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": FINGERPRINT,
        "usage": usage(gen.prompt_tokens, total_completion_tokens(gen, len(prompts))),
        "kv_transfer_params": None,
    }


def completion_stream(
    gen: Generation, prompts: list[str | list[int]], rid: str, created: int
) -> Iterator[str]:
    """The JSON payloads of a completions stream, without the final ``[DONE]``."""
    head = (
        f'{{"id":"{rid}","object":"text_completion","created":{created},'
        f'"model":{dumps(gen.model)},"choices":[{{"index":'
    )
    count = len(prompts) * gen.n
    tokens = [output_tokens(gen.completion_tokens, index) for index in range(count)]
    last = gen.completion_tokens - 1
    fin_last = dumps(gen.finish_reason)
    done = 0
    for step in range(gen.completion_tokens):
        fin = fin_last if step == last else "null"
        for index in range(count):
            done += 1
            tail = ""
            if gen.continuous_usage:
                tail = f',"usage":{dumps(stream_usage(gen.prompt_tokens, done))}'
            yield (
                f'{head}{index},"text":{_tok(tokens[index][step])},"logprobs":null,'
                f'"finish_reason":{fin},"stop_reason":null,"prompt_token_ids":null,'
                f'"token_ids":null}}]{tail}}}'
            )
    if gen.include_usage:
        yield _usage_event("text_completion", gen, rid, created, done)


def embedding_response(
    model: str,
    inputs: list[str | list[int]],
    dim: int,
    base64_format: bool,
    prompt_tokens: int,
    created: int,
) -> dict[str, Any]:
    """An embeddings ``list`` object (``encoding_format`` float or base64 of float32 LE)."""
    data = []
    for i, item in enumerate(inputs):
        key = item if isinstance(item, str) else " ".join(map(str, item))
        vec = embedding(key, dim)
        value: list[float] | str = vec
        if base64_format:
            value = base64.b64encode(struct.pack(f"<{dim}f", *vec)).decode()
        data.append({"index": i, "object": "embedding", "embedding": value})
    return {
        "id": new_id("embd"),
        "object": "list",
        "created": created,
        "model": model,
        "data": data,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }


def models_response(config: SimConfig, created: int) -> dict[str, Any]:
    """The ``GET /v1/models`` list (``owned_by: "vllm-sim"`` marks the simulator)."""
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm-sim",
                "root": name,
                "parent": None,
                "max_model_len": config.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{name}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for name in config.models
        ],
    }
