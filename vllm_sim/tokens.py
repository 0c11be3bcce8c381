"""Deterministic "tokenizer" and "model" of the simulator.

Nothing here is a real tokenizer: the prompt length is a deterministic approximation (one token
per word or punctuation mark, whitespace attached to the following piece), so that usage numbers
and the context-length check are reproducible. Generated text cycles through ``OUTPUT_TOKENS``,
which mixes ASCII with 2-, 3- and 4-byte UTF-8 characters so that relays that split UTF-8
across network writes are exercised.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from collections.abc import Iterable
from typing import Any

OUTPUT_TOKENS: tuple[str, ...] = (
    "Hello",
    ",",
    " this",
    " is",
    " the",
    " vLLM",
    " simulator",
    ":",
    " café",
    " naïve",
    " 日本",
    "語",
    " 🚀",
    " ✓",
    " über",
    ".",
)
"""Generated tokens, in order; choice ``i`` starts at offset ``i``."""

_PIECE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")


def split_pieces(text: str) -> list[str]:
    """Split text into token pieces (words and punctuation, leading whitespace attached).

    ``"".join(split_pieces(t)) == t`` for every string ``t``.
    """
    return _PIECE.findall(text)


def piece_ids(pieces: Iterable[str]) -> list[int]:
    """Stable token ids of token pieces (31-bit, from BLAKE2b of the piece's UTF-8).

    The simulator has no vocabulary; an id only has to be the same for the same piece in every
    process, so that KV-cache events name tokens the same way each time.
    """
    return [int.from_bytes(hashlib.blake2b(p.encode(), digest_size=4).digest(), "big") >> 1
            for p in pieces]


def count_text(text: str) -> int:
    """Approximate token count of ``text`` (see ``split_pieces``)."""
    return len(_PIECE.findall(text))


def message_text(content: Any) -> str:
    """Text of a chat message ``content``: a string or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return str(content)


def output_tokens(n: int, offset: int = 0) -> list[str]:
    """The first ``n`` generated tokens of a choice whose index is ``offset``."""
    size = len(OUTPUT_TOKENS)
    return [OUTPUT_TOKENS[(offset + i) % size] for i in range(n)]


def json_tokens(n: int, offset: int = 0) -> list[str]:
    """``n`` tokens whose concatenation is a JSON object (``response_format`` json_object).

    The first token opens ``{"text": "`` and the last closes it; a text cut short by
    ``max_tokens`` is truncated JSON, as with a real model.
    """
    if n == 1:
        return ["{}"]
    body = [t for t in output_tokens(n - 2, offset)]
    return ['{"text": "', *body, '"}']


def tool_arguments(tool: dict[str, Any]) -> str:
    """JSON arguments for a call of ``tool`` (an OpenAI ``tools[]`` entry).

    Every property of the function's JSON Schema gets a value of its declared type.
    """
    params = tool.get("function", {}).get("parameters") or {}
    props = params.get("properties") or {}
    args: dict[str, Any] = {}
    for name, schema in props.items():
        kind = schema.get("type") if isinstance(schema, dict) else None
        if isinstance(schema, dict) and schema.get("enum"):
            args[name] = schema["enum"][0]
        elif kind == "integer":
            args[name] = 1
        elif kind == "number":
            args[name] = 1.5
        elif kind == "boolean":
            args[name] = True
        elif kind == "array":
            args[name] = []
        elif kind == "object":
            args[name] = {}
        else:
            args[name] = "café 日本 🚀"
    return json.dumps(args, ensure_ascii=False)


def fragments(text: str, size: int = 4) -> list[str]:
    """Cut ``text`` into pieces of ``size`` characters (tool-call argument deltas)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def embedding(text: str, dim: int) -> list[float]:
    """A deterministic unit vector of length ``dim`` derived from ``text`` (SHA-256 stream)."""
    raw = b""
    counter = 0
    while len(raw) < 4 * dim:
        raw += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    values = [(v / 2**31) - 1.0 for v in struct.unpack(f"<{dim}I", raw[: 4 * dim])]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


class Vocab:
    """A growing piece <-> id table backing ``/tokenize`` and ``/detokenize``.

    Ids are assigned in first-seen order starting at 1000 (0..999 are left for "special"
    tokens, none of which the simulator emits). One table per app, so ids are stable for the
    lifetime of a simulator.
    """

    FIRST_ID = 1000

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._pieces: list[str] = []
        for tok in OUTPUT_TOKENS:
            self.encode(tok)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        out = []
        for piece in split_pieces(text):
            tid = self._ids.get(piece)
            if tid is None:
                tid = self.FIRST_ID + len(self._pieces)
                self._ids[piece] = tid
                self._pieces.append(piece)
            out.append(tid)
        return out

    def decode(self, ids: Iterable[int]) -> str:
        """Text of token ids; unknown ids decode to ``""`` like vLLM's tokenizers skip them.

        Raises:
            ValueError: an id is negative.
        """
        parts = []
        for tid in ids:
            if tid < 0:
                raise ValueError(f"token id {tid} is negative")
            idx = tid - self.FIRST_ID
            if 0 <= idx < len(self._pieces):
                parts.append(self._pieces[idx])
        return "".join(parts)
