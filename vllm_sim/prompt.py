"""The prompt as the engine model sees it: a chat-template-like rendering cut into token pieces.

The rendering is prefix-stable, like real chat templates: the prompt of turn *k + 1* (history
plus the answer of turn *k* plus a new question) starts with the prompt of turn *k* followed by
the answer, so a multi-turn conversation reuses its cached blocks. Tools are rendered first
(where templates put them). Not a real tokenizer: pieces come from
:func:`vllm_sim.tokens.split_pieces`.
"""

from __future__ import annotations

import json
from typing import Any

from vllm_sim.tokens import message_text, split_pieces

__all__ = ["chat_text", "completion_text", "prompt_pieces"]


def _message(role: str, content: str) -> str:
    return f"<|{role}|>{content}<|end|>"


def chat_text(body: dict[str, Any], answer: str | None = None) -> str:
    """Render a chat request (``messages``, ``tools``) as one string.

    Args:
        body: The request body (already validated by ``parse_chat``).
        answer: When given, the assistant answer appended as a message (the next turn's view).
    """
    parts: list[str] = []
    tools = body.get("tools")
    if tools:
        parts.append(_message("tools", json.dumps(tools, sort_keys=True, separators=(",", ":"))))
    for msg in body.get("messages") or []:
        if isinstance(msg, dict):
            parts.append(_message(str(msg.get("role", "")), message_text(msg.get("content"))))
    if answer is not None:
        parts.append(_message("assistant", answer))
    else:
        parts.append("<|assistant|>")
    return "".join(parts)


def completion_text(prompts: list[str | list[int]]) -> str:
    """Render completion prompts (strings, or token ids as decimal words) as one string."""
    return "".join(p if isinstance(p, str) else " ".join(map(str, p)) for p in prompts)


def prompt_pieces(text: str) -> list[str]:
    """The token pieces of a rendered prompt."""
    return split_pieces(text)
