"""Parse and check a batch input file (OpenAI batch JSONL: one request object per line).

Each non-empty line is ``{"custom_id": str, "method": "POST", "url": <endpoint>, "body":
{...}}`` (https://platform.openai.com/docs/api-reference/batch/request-input); every line's
``url`` must be the batch's endpoint, ``custom_id`` unique, and ``body.stream`` not true.
"""

from __future__ import annotations

import json

from gateway.batch.errors import BadInputFile
from gateway.relay.strict_json import StrictJsonError, loads_strict

__all__ = ["ENDPOINTS", "parse_input"]

ENDPOINTS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                       "/v1/responses"})
"""Endpoints a batch may target (relay paths of :mod:`gateway.relay.pipeline`)."""


def parse_input(content: bytes, endpoint: str, max_requests: int) -> list[tuple[int, str, bytes]]:
    """The requests of an input file: ``(line number, custom_id, body JSON)``.

    Args:
        content: The file's bytes (UTF-8 JSONL).
        endpoint: The batch's ``endpoint``.
        max_requests: Most requests allowed.

    Returns:
        One tuple per request, line numbers 1-based.

    Raises:
        BadInputFile: The first problem found, naming its line (``param`` ``input_file_id``).
    """
    out: list[tuple[int, str, bytes]] = []
    seen: set[str] = set()

    def bad(line: int, what: str) -> BadInputFile:
        return BadInputFile(f"Input file line {line}: {what}.", param="input_file_id")

    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            item = loads_strict(raw)
        except StrictJsonError as exc:
            raise bad(number, f"not valid JSON ({exc})") from exc
        if not isinstance(item, dict):
            raise bad(number, "not a JSON object")
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            raise bad(number, "'custom_id' must be a non-empty string")
        if custom_id in seen:
            raise bad(number, f"'custom_id' {custom_id[:64]!r} is used more than once")
        seen.add(custom_id)
        if item.get("method") != "POST":
            raise bad(number, "'method' must be \"POST\"")
        if item.get("url") != endpoint:
            raise bad(number, f"'url' {str(item.get('url'))[:64]!r} is not the batch's "
                              f"endpoint {endpoint!r}")
        body = item.get("body")
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise bad(number, "'body' must be an object with a 'model'")
        if body.get("stream") is True:
            raise bad(number, "'body.stream' is not supported in a batch")
        out.append((number, custom_id, json.dumps(body).encode()))
        if len(out) > max_requests:
            raise bad(number, f"more than {max_requests} requests (batch.max_requests)")
    if not out:
        raise BadInputFile("The input file holds no requests.", param="input_file_id")
    return out
