"""A scan that does not finish never lowers what the ``pii`` rules would have done (tester F3).

A client chooses when a scan times out: a pad of digit runs makes it outlast ``timeout_s``.
Such a request used to pass unscanned at its key's class (``fail_closed_classes`` defaults to
``[]``), an IBAN in it sent where its class may not go. Now an unscanned request is decided as
if every entity type had been found: raised to the most sensitive class a ``raise`` could
give, or refused 503 ``pii_scan_failed`` where a ``mask`` or ``refuse`` action could apply.

The stack is tests/gateway/test_pii_gateway.py's: three simulators ``us``, ``eu-b``, ``eu-a``
(``confidential`` may go to ``eu-a`` only), a real gateway, the official openai SDK, SQLite
audit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.gateway.test_pii_gateway import IBAN, Stack, _build

#: Raise only (no mask or refuse action anywhere): an unscanned request is raised.
RAISING = """\
pii:
  default_class: confidential
  entity_classes: {EMAIL_ADDRESS: internal}
  timeout_s: %s
  inline_max_chars: %d%s
  rules:
    - {id: research-masks, teams: [research], action: mask}
"""
#: Digit runs: no finding, ~0.2 s of detector work per 400 KB (tester F3's pad).
PAD = " ".join(str(10**9 + i * 7919) for i in range(36000))


def _pii(timeout_s: str = "0.05", inline: int = 8192, max_chars: int | None = None) -> str:
    limit = f"\n  max_scan_chars: {max_chars}" if max_chars is not None else ""
    return RAISING % (timeout_s, inline, limit)


def _send(stack: Stack, who: str, text: str, pad: str | None = None) -> None:
    extra: dict[str, Any] = {"user": pad} if pad is not None else {}
    with stack.client(who) as client:
        client.chat.completions.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": text}], **extra)


def _records(stack: Stack) -> list[dict[str, Any]]:
    return [r for r in stack.audit_requests()
            if r.get("pii") and r["pii"].get("class_before") is not None]


def test_a_padded_prompt_never_goes_where_its_iban_may_not(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    """Tester F3: an IBAN + ~395 KB of digit runs in ``user``, ``timeout_s`` 50 ms: scanned
    in time or not, the request goes only where ``confidential`` may."""
    stack = _build(serve_asgi, tmp_path, pii=_pii())
    for i in range(4):
        _send(stack, "pub", f"Please pay invoice {i} to {IBAN}.", PAD)
    assert stack.received() == {"eu-a": 4, "eu-b": 0, "us": 0}
    for rec in _records(stack):
        assert rec["pii"]["class_after"] == "confidential", rec["pii"]
        assert rec.get("data_class", "confidential") == "confidential"


def test_a_scan_that_times_out_raises_the_class_as_if_everything_was_found(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    stack = _build(serve_asgi, tmp_path, pii=_pii(timeout_s="0.000001", inline=0))
    for text in (f"Please pay to {IBAN}.", "Nothing in here at all."):
        for _ in range(3):
            _send(stack, "pub", text)
    assert stack.received() == {"eu-a": 6, "eu-b": 0, "us": 0}
    recs = _records(stack)
    assert len(recs) >= 6
    for rec in recs:
        assert rec["pii"]["error"] == "scan timed out"
        assert (rec["pii"]["class_before"], rec["pii"]["class_after"]) == ("public",
                                                                            "confidential")
        assert rec["pii"]["entities"] == {}
        assert rec.get("data_class", "confidential") == "confidential"


def test_a_text_over_max_scan_chars_is_not_scanned_and_is_raised(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    stack = _build(serve_asgi, tmp_path, pii=_pii(timeout_s="5.0", max_chars=100_000))
    for _ in range(3):
        _send(stack, "pub", f"Please pay to {IBAN}.", PAD)
    assert stack.received() == {"eu-a": 3, "eu-b": 0, "us": 0}
    errors = {r["pii"]["error"] for r in _records(stack)}
    assert errors == {"scan skipped (text over pii.max_scan_chars)"}
    _send(stack, "pub", "A prompt under the limit, scanned: nothing found.", "x" * 20_000)
    assert sum(stack.received().values()) == 4
    last = _records(stack)[-1]["pii"]
    assert (last["error"], last["class_after"]) == (None, "public")


def test_an_unscanned_request_is_refused_where_a_mask_rule_could_apply(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    """The research team's findings are masked: unscanned, nothing can be masked, so its
    request is refused; a key no mask rule applies to is raised instead."""
    stack = _build(serve_asgi, tmp_path, pii=_pii(timeout_s="0.000001", inline=0))
    with pytest.raises(openai.InternalServerError) as info:
        _send(stack, "research", f"Please pay to {IBAN}.")
    assert info.value.status_code == 503
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "pii_scan_failed"
    assert "IBAN_CODE" in info.value.body["message"] and "3704" not in info.value.body["message"]
    assert stack.received() == {"eu-a": 0, "eu-b": 0, "us": 0}
    _send(stack, "pub", f"Please pay to {IBAN}.")
    assert stack.received() == {"eu-a": 1, "eu-b": 0, "us": 0}
    refused = [r for r in _records(stack) if r["pii"]["error"] == "pii_scan_failed"]
    assert refused and refused[0]["pii"]["class_before"] == "public"
