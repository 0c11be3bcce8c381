"""Token estimation before forwarding (for tokens-per-minute limits and budgets).

With a ``tokenizer.json`` staged locally for the model (``quotas.tokenizers``), the prompt is
counted with the model's own tokenizer (the ``tokenizers`` library, loaded from the file:
never downloaded). Otherwise a documented approximation is used:

    prompt_tokens = ceil(utf8_bytes(text) / 4) + message_overhead_tokens * messages + 3

(about four bytes of English text per BPE token; the per-message overhead covers role and
separator tokens of chat templates; 3 primes the assistant reply). Token id prompts
(``prompt: [1, 2, 3]``) count exactly. To the prompt estimate we add a completion reserve,
an upper bound of what the backend may generate (:func:`generation_bound`)::

    completion_reserve = min(max_tokens, completion_reserve_cap) * completions
    completions = max(n, best_of) * prompts

where ``max_tokens`` is the largest of ``max_tokens`` / ``max_completion_tokens`` /
``max_output_tokens`` present (vLLM reads ``max_completion_tokens`` or else ``max_tokens`` on
chat, ``max_tokens`` on completions, ``max_output_tokens`` on responses: the largest bounds
each), or ``completion_reserve_tokens`` when none is; ``prompts`` is the number of prompts of
a ``/v1/completions`` list prompt (one completion each), else 1. Counts are read as vLLM's
pydantic models read them (lax integers: ``3``, ``"3"``, ``3.0``). The limiter later corrects
the estimate with the real usage reported by the backend.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from gateway.quotas.errors import InvalidGenerationField

_log = logging.getLogger(__name__)

#: Last path segments of endpoints that produce no completion tokens.
NO_COMPLETION_ENDPOINTS = frozenset(
    {"embeddings", "rerank", "score", "tokenize", "detokenize", "classify", "pooling"}
)
#: Fields bounding the tokens of one completion (the largest present bounds every endpoint).
MAX_TOKEN_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
#: Fields multiplying the completions: ``n`` choices, ``best_of`` candidates generated.
CHOICE_FIELDS = ("n", "best_of")
#: ``max_tokens`` of a ``/v1/completions`` request that leaves the field out (vLLM's
#: ``CompletionRequest`` default, as OpenAI's legacy completions).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
#: Reads an integer field as pydantic's lax mode does (vLLM's request models): 3, "3", 3.0.
_LAX_INT: TypeAdapter[int] = TypeAdapter(int)
#: Above this many bytes of prompt text, tokenizing runs in a worker thread.
THREAD_THRESHOLD_BYTES = 32 * 1024


@dataclass(frozen=True)
class TokenEstimate:
    """An estimate of the tokens a request will use.

    Attributes:
        prompt: estimated prompt tokens.
        completion_reserve: tokens reserved for the completion.
        method: ``tokenizer`` (the model's own) or ``approx`` (bytes / 4).
        completions: completions the backend may generate (``max(n, best_of) * prompts``).
        completion_bound: tokens of one completion at most as the gateway charges it (the
            request's max tokens within ``completion_reserve_cap``, else the cap).
    """

    prompt: int
    completion_reserve: int
    method: Literal["tokenizer", "approx"]
    completions: int = 1
    completion_bound: int = 0

    @property
    def total(self) -> int:
        """Prompt plus completion reserve: what the limiter charges at admission."""
        return self.prompt + self.completion_reserve


class TokenEstimator:
    """Estimates request tokens per model.

    Args:
        tokenizers: model name -> local directory holding ``tokenizer.json``.
        message_overhead_tokens: per-message overhead of the approximation.
        completion_reserve_tokens: reserve when the request gives no max tokens.
        completion_reserve_cap: cap on a reserve taken from the request's max tokens.
    """

    def __init__(
        self,
        tokenizers: Mapping[str, Path] | None = None,
        *,
        message_overhead_tokens: int = 4,
        completion_reserve_tokens: int = 0,
        completion_reserve_cap: int = 1024,
    ) -> None:
        self._dirs = dict(tokenizers or {})
        self._loaded: dict[str, Any] = {}
        self._overhead = message_overhead_tokens
        self._reserve = completion_reserve_tokens
        self._cap = completion_reserve_cap

    def load(self) -> dict[str, str]:
        """Load every configured tokenizer now (call at start-up).

        Returns:
            Model name -> ``"tokenizer"`` or the reason it falls back to the approximation.
        """
        return {model: self._status(model) for model in self._dirs}

    def _status(self, model: str) -> str:
        return "tokenizer" if self._tokenizer(model) is not None else "approx"

    def _tokenizer(self, model: str) -> Any:
        if model in self._loaded:
            return self._loaded[model]
        tok: Any = None
        directory = self._dirs.get(model)
        if directory is not None:
            path = Path(directory) / "tokenizer.json"
            try:
                from tokenizers import Tokenizer

                tok = Tokenizer.from_file(str(path))
            except ImportError:
                _log.warning("tokenizers not installed: approximate token counts for %s", model)
            except Exception as exc:
                _log.warning(
                    "cannot load %s (%s): approximate token counts for %s", path, exc, model
                )
        self._loaded[model] = tok
        return tok

    def estimate(
        self, model: str, body: Mapping[str, Any], endpoint: str | None = None,
        *, strict: bool = False,
    ) -> TokenEstimate:
        """Estimate the tokens of one request body (an OpenAI-style JSON object).

        Args:
            model: the model name the client asked for (selects the tokenizer).
            body: the parsed request body.
            endpoint: the request path (``/v1/embeddings`` ...); endpoints that generate no
                completion get no completion reserve. When None, the body shape decides.
            strict: refuse a count field (``n``, ``max_tokens``, ...) that is not an integer
                the backend accepts (quotas: the reserve must bound the generation); otherwise
                such a field counts as absent (flow control's fair-share cost).

        Returns:
            The estimate; apart from ``strict``, never raises on odd bodies (unknown shapes
            count their JSON size).

        Raises:
            InvalidGenerationField: ``strict`` and a count field is not a valid count.
        """
        texts, messages, exact = _prompt_parts(body)
        tok = self._tokenizer(model) if model in self._dirs else None
        text = "\n".join(texts)
        if tok is not None:
            counted = len(tok.encode(text, add_special_tokens=False).ids) if text else 0
            method: Literal["tokenizer", "approx"] = "tokenizer"
        else:
            counted = math.ceil(len(text.encode("utf-8", "surrogatepass")) / 4)
            method = "approx"
        prompt = counted + exact
        if messages:
            prompt += self._overhead * messages + 3
        reserve, completions, bound = self._completion_reserve(body, endpoint, strict)
        return TokenEstimate(prompt, reserve, method, completions, bound)

    async def estimate_async(
        self, model: str, body: Mapping[str, Any], endpoint: str | None = None,
        *, strict: bool = False,
    ) -> TokenEstimate:
        """Like :meth:`estimate`, tokenizing large prompts in a worker thread."""
        if model in self._dirs and _rough_size(body) > THREAD_THRESHOLD_BYTES:
            return await asyncio.to_thread(self.estimate, model, body, endpoint, strict=strict)
        return self.estimate(model, body, endpoint, strict=strict)

    def _completion_reserve(
        self, body: Mapping[str, Any], endpoint: str | None, strict: bool
    ) -> tuple[int, int, int]:
        """(reserve, completions, tokens per completion at most) of one request."""
        if endpoint is not None:
            if endpoint.rstrip("/").rsplit("/", 1)[-1] in NO_COMPLETION_ENDPOINTS:
                return 0, 0, 0
        elif "input" in body and "messages" not in body and "prompt" not in body:
            if not any(k in body for k in ("max_output_tokens", "instructions")):
                return 0, 0, 0  # embeddings / rerank-like: no completion
        try:
            max_tokens, completions = generation_bound(body, endpoint)
        except InvalidGenerationField as exc:
            if strict:
                raise
            # Lenient (a cost, not a bound): the unreadable field counts as absent.
            rest = {k: v for k, v in body.items() if k != exc.param}
            return self._completion_reserve(rest, endpoint, strict)
        if max_tokens is None:
            return self._reserve * completions, completions, max(self._cap, self._reserve)
        bound = min(max_tokens, self._cap)
        return bound * completions, completions, bound


def lax_int(body: Mapping[str, Any], name: str) -> int | None:
    """Read an integer field as vLLM's request models (pydantic, lax mode) read it.

    Args:
        body: the parsed request body.
        name: the field.

    Returns:
        The integer (``3``, ``"3"``, ``3.0``, ``" 3 "`` and ``True`` are read as vLLM reads
        them), or None when the field is absent or null.

    Raises:
        InvalidGenerationField: the field is present but not an integer (``"x"``, ``2.5``).
    """
    value = body.get(name)
    if value is None:
        return None
    if type(value) is int:
        return value
    try:
        return _LAX_INT.validate_python(value)
    except ValidationError:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise InvalidGenerationField(
            name, f"'{name}' must be an integer, got {shown}.") from None


def _counts(body: Mapping[str, Any], names: Iterable[str], least: int) -> list[int]:
    """The integer values of the fields ``names`` present in ``body`` (read by
    :func:`lax_int`).

    Raises:
        InvalidGenerationField: a value below ``least``.
    """
    out = []
    for name in names:
        value = lax_int(body, name)
        if value is None:
            continue
        if value < least:
            raise InvalidGenerationField(name, f"'{name}' must be at least {least}, got {value}.")
        out.append(value)
    return out


def generation_bound(body: Mapping[str, Any], endpoint: str | None) -> tuple[int | None, int]:
    """What the backend may generate for a request: tokens per completion and completions.

    Args:
        body: the parsed request body.
        endpoint: the request path; None lets the body's shape decide (a ``prompt`` field is
            a completions prompt).

    Returns:
        ``(max_tokens, completions)``: the largest of :data:`MAX_TOKEN_FIELDS` present (None
        when none is; on ``/v1/completions`` without a ``max_tokens`` key, at least the
        backend's default :data:`COMPLETIONS_DEFAULT_MAX_TOKENS`; an explicit null leaves the
        backend unbounded, so None), and ``max(n, best_of) * prompts`` (``n`` and ``best_of``
        are not read on ``/v1/responses``, which has neither; ``prompts`` counts the prompts
        of a ``/v1/completions`` list prompt, one completion each, else 1).

    Raises:
        InvalidGenerationField: a count is not an integer, ``n``/``best_of`` is below 1 or a
            max-tokens field below 0 (vLLM refuses them as well).
    """
    present = _counts(body, MAX_TOKEN_FIELDS, 0)
    largest = max(present) if present else None
    last = endpoint.rstrip("/").rsplit("/", 2)[-2:] if endpoint is not None else []
    choices = 1
    if last[-1:] != ["responses"]:
        choices = max([1, *_counts(body, CHOICE_FIELDS, 1)])
    completions_path = last[-1:] == ["completions"] and last[:1] != ["chat"]
    if endpoint is None or completions_path:
        choices *= _prompt_count(body)
    if completions_path and "max_tokens" not in body:
        largest = max(largest or 0, COMPLETIONS_DEFAULT_MAX_TOKENS)
    return largest, choices


def _prompt_count(body: Mapping[str, Any]) -> int:
    """Prompts of a completions body: a list of strings or of token-id lists is one prompt
    per item; a string or one token-id list is one (chat bodies, with ``messages``: 1)."""
    prompt = body.get("prompt")
    if "messages" in body or not isinstance(prompt, list) or not prompt:
        return 1
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return 1  # one prompt of token ids
    return len(prompt)


def _rough_size(body: Mapping[str, Any]) -> int:
    total = 0
    for key in ("messages", "prompt", "input"):
        value = body.get(key)
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, list):
            total += sum(len(json.dumps(v)) if not isinstance(v, str) else len(v) for v in value)
    return total


def _prompt_parts(body: Mapping[str, Any]) -> tuple[list[str], int, int]:
    """Return (texts to tokenize, number of chat messages, exactly known token ids)."""
    texts: list[str] = []
    exact = 0
    messages = body.get("messages")
    n_messages = 0
    if isinstance(messages, list):
        for msg in messages:
            if not isinstance(msg, Mapping):
                continue
            n_messages += 1
            _collect_content(msg.get("content"), texts)
            for key in ("name", "reasoning_content"):
                if isinstance(msg.get(key), str):
                    texts.append(msg[key])
            calls = msg.get("tool_calls")
            if isinstance(calls, list):
                texts.append(json.dumps(calls, ensure_ascii=False))
        for key in ("tools", "functions", "response_format"):
            if body.get(key) is not None:
                texts.append(json.dumps(body[key], ensure_ascii=False))
        return texts, n_messages, exact
    for key in ("prompt", "input", "query", "documents", "text_1", "text_2", "instructions"):
        value = body.get(key)
        if value is None:
            continue
        exact += _collect_prompt(value, texts)
    if not texts and not exact:
        # Unknown shape: count the JSON body itself rather than zero.
        texts.append(json.dumps(body, ensure_ascii=False, default=str))
    return texts, 0, exact


def _collect_content(content: Any, texts: list[str]) -> None:
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping):
                for key in ("text", "input_text", "content"):
                    if isinstance(part.get(key), str):
                        texts.append(part[key])


def _collect_prompt(value: Any, texts: list[str]) -> int:
    """Collect a completions/embeddings prompt; returns the number of literal token ids."""
    if isinstance(value, str):
        texts.append(value)
        return 0
    if isinstance(value, list):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return len(value)
        exact = 0
        for item in value:
            if isinstance(item, Mapping):
                _collect_content(item.get("content"), texts)
                if isinstance(item.get("text"), str):
                    texts.append(item["text"])
            else:
                exact += _collect_prompt(item, texts)
        return exact
    return 0
