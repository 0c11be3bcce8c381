"""A request's routing hint: its prompt cut into chained blocks, its session and token count.

:func:`build_hint` reads a request body once, before the decision
(:mod:`gateway.fleet.scoring`): the prompt's token ids when the body gives them (a completions
``prompt`` of token ids) or a tokenizer makes them, else the canonical prompt text
(:func:`gateway.fleet.prefix_index.canonical_prompt`) cut into ``block_chars`` blocks. The
decision then fills :attr:`RouteHint.explain` and charges the chosen replica, which
:meth:`RouteHint.release` undoes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.fleet.prefix_index import block_hashes, canonical_prompt, token_block_hashes
from gateway.fleet.settings import RoutingSettings

if TYPE_CHECKING:
    from gateway.fleet.pending import PendingPrefixes
    from gateway.fleet.replica import Replica

__all__ = ["RouteHint", "build_hint", "load_tokenizer", "prompt_ids"]


@dataclass(slots=True)
class RouteHint:
    """What the strategy needs from one request, and what it decided.

    Attributes:
        hashes: Chained block hashes of the canonical prompt.
        session: Session key (``x-session-id`` header or body ``user``), if any.
        tokens: Estimated prompt tokens (tokenizer count, or characters / ``chars_per_token``).
        explain: Filled by the decision: strategy, reason, matched and prompt blocks, and the
            load figures used (copied to the access line and the audit record).
        charged: Uncached prompt tokens added to the chosen replica's
            :attr:`~gateway.routing.Replica.prefill_tokens` until :meth:`release`.
        pending: The entry of the prompt's blocks in the pending overlay (0: none), settled by
            :meth:`release`.
        token_ids: The prompt's token ids as the replicas tokenize them, when known (matched
            against the exact, event-fed index).
        units: What ``hashes`` were cut from (the canonical text, or token ids): the
            rendezvous tie-break hashes the block after the longest cached prefix from it.
        block: Units (characters or tokens) per block of ``units``.
    """

    hashes: list[int]
    session: str | None = None
    tokens: float = 0.0
    explain: dict[str, Any] | None = None
    charged: float = 0.0
    pending: int = 0
    _replica: Replica | None = None
    _overlay: PendingPrefixes | None = None
    token_ids: list[int] | None = None
    units: str | Sequence[int] = ""
    block: int = 1

    def release(self) -> None:
        """The request's prefill is over (first response byte, or the attempt ended).

        Takes its uncached tokens off the replica's queued prefill estimate and settles its
        pending blocks; idempotent.
        """
        if self.pending and self._overlay is not None:
            self._overlay.settle(self.pending)
            self.pending = 0
        r = self._replica
        if r is not None:
            self._replica = None
            r.prefill_tokens = max(0.0, r.prefill_tokens - self.charged)


def build_hint(
    body: Mapping[str, Any], session: str | None, settings: RoutingSettings, tokenizer: Any,
) -> RouteHint:
    """The routing hint of a request body.

    Args:
        body: The parsed JSON request (chat ``messages`` or completions ``prompt``).
        session: The ``x-session-id`` header, if any; without it the body's ``user`` is the
            session key. Both are dropped unless ``settings.session_affinity``.
        settings: The ``routing`` section (block sizes, ``max_prompt_chars``,
            ``chars_per_token``).
        tokenizer: A ``tokenizers.Tokenizer`` (:func:`load_tokenizer`) or ``None``.

    Returns:
        The hint: token-id blocks of ``settings.block_tokens`` when token ids are given or
        made, else text blocks of ``settings.block_chars`` characters.
    """
    s = settings
    text = canonical_prompt(body)
    hashes: list[int] = []
    tokens = 0.0
    token_ids = prompt_ids(body)
    units: str | Sequence[int] = ""
    block = s.block_tokens
    if token_ids is not None:
        hashes = token_block_hashes(token_ids, s.block_tokens)
        tokens = float(len(token_ids))
        units = token_ids
    elif text:
        if tokenizer is not None:
            ids = tokenizer.encode(text[: s.max_prompt_chars]).ids
            hashes = token_block_hashes(ids, s.block_tokens)
            tokens = float(len(ids))
            units = ids
            if isinstance(body.get("prompt"), str):
                # A completions prompt is tokenized as is (a chat body goes through the
                # model's chat template, which the gateway does not render).
                token_ids = list(ids)
        else:
            hashes = block_hashes(text, s.block_chars, s.max_prompt_chars)
            tokens = min(len(text), s.max_prompt_chars) / s.chars_per_token
            units, block = text, s.block_chars
    if session is None and s.session_affinity:
        user = body.get("user")
        session = user if isinstance(user, str) and user else None
    return RouteHint(hashes, session if s.session_affinity else None, tokens,
                     token_ids=token_ids, units=units, block=block)


def prompt_ids(body: Mapping[str, Any]) -> list[int] | None:
    """A completions ``prompt`` given as token ids (one list, or a list of one list), else
    ``None``."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if (isinstance(prompt, list) and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
        return list(prompt)
    return None


def load_tokenizer(path: str) -> Any:
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json`` file.

    Raises:
        ValueError: The ``tokenizers`` package is missing or the file cannot be loaded (the
            message names ``routing.tokenizer_file`` and the path).
    """
    try:
        from tokenizers import Tokenizer  # optional dependency, only with tokenizer_file
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ValueError(f"routing.tokenizer_file {path}: the 'tokenizers' package is missing") \
            from exc
    try:
        return Tokenizer.from_file(path)
    except Exception as exc:
        raise ValueError(f"routing.tokenizer_file {path}: cannot load: {exc}") from exc
