"""Sensitive data in requests: the policy's ``pii`` section applied before routing.

The relay calls :meth:`PiiStage.inspect` right after the body is parsed and the key's class is
resolved, before the model's replicas are chosen. The texts that reach a model are scanned
(:data:`SCANNED_FIELDS`: chat ``messages``, completions ``prompt``, Responses ``input`` and
``instructions``, embeddings ``input``); what the policy decides (:mod:`policy.pii.inspect`)
then happens here:

* a ``raise`` changes the request's data class, so the route table, egress rules, quotas and
  flow-control lanes all see the raised class (a ``public`` key's request with an IBAN may only
  go where ``personal`` may);
* ``mask`` rewrites the body with ``<ENTITY>`` in place of each match before it is forwarded;
* ``refuse`` answers 403 ``pii_refused`` naming the entity types (never the values);
* a detector failure or timeout answers 503 ``pii_scan_failed`` for the classes the policy
  fails closed for, and passes (recorded) for the others.

The request record carries the verdict (``record.pii``: entity types and counts, actions, class
before and after, never matched text) for the audit log and the metrics.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from gateway.auth import Principal
from gateway.errors import SensitiveDataRefused, SensitiveDataScanFailed
from gateway.records import RequestRecord
from gateway.rewrite import ParsedBody, parse_body
from policy import PiiPolicy, PiiRefused, PiiScanFailed, PiiVerdict, Policy

__all__ = ["SCANNED_FIELDS", "PiiStage", "pii_stage"]

#: Request fields scanned per relay path (the text a model reads).
SCANNED_FIELDS: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("messages",),
    "/v1/completions": ("prompt",),
    "/v1/responses": ("input", "instructions"),
    "/v1/embeddings": ("input",),
}


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
                      record: RequestRecord) -> tuple[Principal, ParsedBody]:
        """The request's principal (class raised) and body (masked) after the policy's decision.

        Raises:
            SensitiveDataRefused: 403 ``pii_refused`` naming the entity types.
            SensitiveDataScanFailed: 503 ``pii_scan_failed`` (detector failed, class fails
                closed).
        """
        fields = SCANNED_FIELDS.get(path)
        if fields is None:
            return principal, parsed
        value = {f: parsed.values[f] for f in fields if f in parsed.values}
        if not value:
            return principal, parsed
        try:
            verdict = await self._pii.inspect_async(
                value, principal.key_id, principal.team, principal.data_class)
        except PiiRefused as exc:
            if isinstance(exc.verdict, PiiVerdict):
                record.detected(exc.verdict.as_record())
            raise SensitiveDataRefused(exc.message, param=fields[0]) from exc
        except PiiScanFailed as exc:
            record.detected({"entities": {}, "actions": {}, "rules": {},
                             "class_before": principal.data_class,
                             "class_after": principal.data_class, "error": exc.code})
            raise SensitiveDataScanFailed(exc.message) from exc
        record.detected(verdict.as_record())
        if verdict.to_mask:
            parsed = _with(parsed, PiiPolicy.masked(value, verdict))
        if verdict.class_after != principal.data_class:
            principal = dataclasses.replace(principal, data_class=verdict.class_after)
            record.identify(principal.key_id, principal.team, principal.data_class)
        return principal, parsed


def _with(parsed: ParsedBody, fields: dict[str, Any]) -> ParsedBody:
    """``parsed`` with top-level ``fields`` replaced (the body re-encoded; the client's
    formatting is not kept, its values and key order are)."""
    body = json.loads(parsed.text)
    body.update(fields)
    return parse_body(json.dumps(body, ensure_ascii=False).encode("utf-8"))
