"""Sensitive data in requests: the policy's ``pii`` section applied before routing.

The relay calls :meth:`PiiStage.inspect` right after the body is parsed and the key's class is
resolved, before the model's replicas are chosen, on every relay path (batch lines too: the
batch runner sends each line through the relay). Everything the body carries upstream is
scanned, at any depth, object keys included, but for a short list of structural fields
(:mod:`gateway.pii.fields`: what is scanned, what is left out and why); a body with a duplicated
key is refused (400), since the replica would receive a value the scan did not read. What the
policy decides (:mod:`policy.pii.inspect`) then happens here:

* a ``raise`` changes the request's data class, so the route table, egress rules, quotas and
  flow-control lanes all see the raised class (a ``public`` key's request with an IBAN may only
  go where ``personal`` may);
* ``mask`` rewrites the body with ``<ENTITY>`` in place of each match, wherever it is, before it
  is forwarded; a match where masking would corrupt the request (an object key, a function
  name, a schema's ``enum``, a number, an encoded ``data:`` URL: :mod:`gateway.pii.fields`) is
  refused instead (403 ``pii_refused``);
* ``refuse`` answers 403 ``pii_refused`` naming the entity types (never the values);
* a scan that did not finish (detector failure, ``timeout_s``, ``max_scan_chars``, the scan
  pool full) is decided as if every entity type had been found (:meth:`policy.PiiPolicy.
  unscanned`): 503 ``pii_scan_failed`` for the classes the policy fails closed for and where
  a ``mask`` or ``refuse`` action could apply; otherwise the class is raised to the most
  sensitive one a ``raise`` could give, the error recorded.

With ``responses: record``, the text a model answered is scanned too, once the response has been
sent (:class:`ResponseScan`: boundary-safe, an entity split across SSE events is found), and the
counts are added to the record. With ``responses: mask`` it is masked before the client sees it,
and values masked reversibly in the request are mapped back in its answer
(:mod:`gateway.pii.response`).

The request record carries the verdict (``record.pii``: entity types and counts, actions, class
before and after, never matched text) for the audit log and the metrics.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from gateway.auth import Principal
from gateway.errors import SensitiveDataRefused, SensitiveDataScanFailed
from gateway.pii.fields import check_unique_keys, is_structural, scanned
from gateway.pii.response import ResponseMasker, mask_numbered
from gateway.relay.records import RequestRecord
from gateway.relay.rewrite import ParsedBody, parse_body
from policy import PiiPolicy, PiiRefused, PiiScanFailed, PiiVerdict, Policy
from policy.pii import Finding

__all__ = ["ANSWER_PATHS", "PiiStage", "ResponseScan", "pii_stage", "response_texts"]

#: Relay paths whose answers are text (scanned and masked with ``pii.responses``); every relay
#: path's request is scanned.
ANSWER_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})


def pii_stage(policy: Policy | None) -> PiiStage | None:
    """The stage of ``policy``'s ``pii`` section (``None`` without one); builds its detector
    now (Presidio imports, once per process; about 0.4 s per policy after that)."""
    if policy is None or policy.pii is None:
        return None
    return PiiStage(policy.pii)


class PiiStage:
    """Scans a request and applies the policy's decision (see the module docstring).

    Args:
        pii: the policy's ``pii`` section; its detector is built here (start-up).
    """

    def __init__(self, pii: PiiPolicy) -> None:
        self._pii = pii
        pii.load()

    async def inspect(self, path: str, principal: Principal, parsed: ParsedBody,
                      record: RequestRecord, restore: dict[str, str] | None = None,
                      ) -> tuple[Principal, ParsedBody]:
        """The request's principal (class raised) and body (masked) after the policy's decision.

        ``restore`` gets placeholder -> value for findings masked reversibly (numbered
        placeholders, ``<IBAN_CODE_1>``), for :meth:`response_masker` to map back.

        Raises:
            SensitiveDataRefused: 403 ``pii_refused`` naming the entity types.
            SensitiveDataScanFailed: 503 ``pii_scan_failed`` (the scan did not finish, and
                the class fails closed or a ``mask``/``refuse`` action could apply).
        """
        check_unique_keys(parsed.raw)
        value = scanned(parsed.values)
        if not value:
            return principal, parsed

        def structural(f: Finding) -> bool:
            return is_structural(value, f.loc)

        try:
            verdict = await self._pii.inspect_async(
                value, principal.key_id, principal.team, principal.data_class, structural)
        except PiiRefused as exc:
            param = None
            if isinstance(exc.verdict, PiiVerdict):
                record.detected(exc.verdict.as_record())
                param = _param(exc.verdict)
            raise SensitiveDataRefused(exc.message, param=param) from exc
        except PiiScanFailed as exc:
            record.detected({"entities": {}, "actions": {}, "rules": {},
                             "class_before": principal.data_class,
                             "class_after": principal.data_class, "error": exc.code})
            raise SensitiveDataScanFailed(exc.message) from exc
        record.detected(verdict.as_record())
        if verdict.to_mask and verdict.reversible and restore is not None:
            parsed = _with(parsed, mask_numbered(value, verdict.to_mask, verdict.reversible,
                                                 restore))
        elif verdict.to_mask:
            parsed = _with(parsed, PiiPolicy.masked(value, verdict))
        if verdict.class_after != principal.data_class:
            principal = dataclasses.replace(principal, data_class=verdict.class_after)
            record.identify(principal.key_id, principal.team, principal.data_class)
        return principal, parsed

    def response_scan(self, path: str) -> ResponseScan | None:
        """A collector of the response's text when ``pii.responses`` is ``record`` and the
        path is scanned (embeddings answer vectors: not scanned)."""
        section = self._pii.section
        if section.responses != "record" or path not in ANSWER_PATHS:
            return None
        return ResponseScan(self._pii, section.response_max_bytes)

    def response_masker(self, path: str,
                        restore: dict[str, str] | None = None) -> ResponseMasker | None:
        """The masker of the response (:mod:`gateway.pii.response`) when ``pii.responses`` is
        ``mask`` or the request was masked reversibly (``restore`` not empty), and the path
        answers text."""
        masking = self._pii.section.responses == "mask"
        if (not masking and not restore) or path not in ANSWER_PATHS:
            return None
        return ResponseMasker(self._pii, masking, restore)


def _param(verdict: PiiVerdict) -> str | None:
    """The top-level member of the first refused finding (the error's ``param``; a member
    named by position when it is no plain identifier: never a key's text)."""
    refused = set(verdict.refused)
    for f in verdict.findings:
        if f.entity in refused:
            return f.path.split(".", 1)[0].split("[", 1)[0] or None
    return None


def _with(parsed: ParsedBody, fields: dict[str, Any]) -> ParsedBody:
    """``parsed`` with top-level ``fields`` replaced (the body re-encoded; the client's
    formatting is not kept, its values and key order are)."""
    body = json.loads(parsed.raw)
    body.update(fields)
    return parse_body(json.dumps(body, ensure_ascii=False).encode("utf-8"))


class ResponseScan:
    """A response's text, collected as it is sent and scanned once at its end (record mode).

    The relay hands every body chunk sent to the client to :meth:`tap` (the responder's content
    tap: a copy, bounded by ``pii.response_max_bytes``); :meth:`finish` then joins the text of
    every SSE event (``delta.content``, ``text``, Responses ``delta``), per choice, so an entity
    split across events (``"DE89 3704"`` + ``" 0044 ..."``) is one string when scanned. The scan
    runs after the last byte went to the client: it costs no time to first token.

    Args:
        pii: the policy's ``pii`` section.
        limit: bytes kept; a longer response is recorded as not scanned.
    """

    def __init__(self, pii: PiiPolicy, limit: int) -> None:
        self._pii = pii
        self._limit = limit
        self._buf = bytearray()
        self._over = False

    def tap(self, chunk: bytes) -> None:
        """Keep a copy of one body chunk (until the limit)."""
        if len(self._buf) + len(chunk) > self._limit:
            self._over = True
        elif not self._over:
            self._buf += chunk

    async def finish(self, record: RequestRecord) -> None:
        """Scan the collected text and add ``response_entities`` (and ``response_error``) to
        the record's ``pii`` verdict."""
        counts: dict[str, int] = {}
        error: str | None = None
        if self._over:
            error = "response larger than pii.response_max_bytes: not scanned"
        else:
            texts = response_texts(bytes(self._buf))
            if texts:
                counts, error = await self._pii.scan_async(texts, record.key_id or "")
        verdict = dict(record.pii or {})
        verdict["response_entities"] = counts
        if error is not None:
            verdict["response_error"] = error
        record.detected(verdict)


def response_texts(body: bytes) -> list[str]:
    """The generated text of a JSON or SSE response body, one string per choice/output.

    Chat (``choices[].message.content``, ``choices[].delta.content``), completions
    (``choices[].text``) and Responses (``output[].content[].text``,
    ``response.output_text.delta`` events); tool-call arguments are included.
    """
    parts: dict[tuple[str, int], list[str]] = {}
    text = body.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        events = [text]
    else:
        events = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    for event in events:
        if event == "[DONE]":
            continue
        try:
            obj = json.loads(event)
        except ValueError:
            continue
        if isinstance(obj, dict):
            _collect(obj, parts)
    return ["".join(p) for p in parts.values() if p]


def _collect(obj: dict[str, Any], parts: dict[tuple[str, int], list[str]]) -> None:
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        out = parts.setdefault(("choice", int(choice.get("index") or 0)), [])
        for holder in (choice.get("message"), choice.get("delta"), choice):
            if not isinstance(holder, dict):
                continue
            for key in ("content", "text", "reasoning_content"):
                if isinstance(holder.get(key), str):
                    out.append(holder[key])
            for call in holder.get("tool_calls") or ():
                fn = call.get("function") if isinstance(call, dict) else None
                if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                    out.append(fn["arguments"])
    if isinstance(obj.get("delta"), str):  # Responses: response.output_text.delta
        parts.setdefault(("output", int(obj.get("output_index") or 0)), []).append(obj["delta"])
    for i, item in enumerate(obj.get("output") or ()):  # Responses, not streamed
        for c in (item.get("content") or ()) if isinstance(item, dict) else ():
            if isinstance(c, dict) and isinstance(c.get("text"), str):
                parts.setdefault(("output", i), []).append(c["text"])
