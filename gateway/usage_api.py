"""``GET /v1/usage``: the caller's own consumption and remaining budget (self-service).

The caller authenticates as for any request (API key, bearer token or client certificate);
the answer covers only the subjects that caller is charged to: its key (or, for a verified
identity, its subject pseudonym's key id), its team and its organisation, with their limits,
the tokens used in the current UTC day and month and what remains of each budget. Nothing of
any other caller is reachable: the subjects are taken from the authenticated principal, never
from the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.auth import authorization_of, bearer_token
from gateway.quotas.hook import QuotaHook
from gateway.state import GatewayState

__all__ = ["USAGE_PATH", "usage"]

USAGE_PATH = "/v1/usage"


async def usage(state: GatewayState, quotas: QuotaHook | None,
                scope: Mapping[str, Any]) -> dict[str, Any]:
    """The usage document of the request's caller.

    Returns:
        ``{"object": "usage", "caller": {...}, "quotas": [...] | None}`` (``None``: quotas
        are off); see :meth:`gateway.quotas.hook.QuotaHook.usage` for the entries.

    Raises:
        GatewayError: Authentication failed (401/403), or the quota backend cannot be read
            (503).
    """
    principal = state.authenticator.authenticate(
        bearer_token(authorization_of(scope["headers"])), scope)
    identity = principal.identity
    org = identity.org if identity is not None else None
    caller = {
        "key_id": principal.key_id,
        "team": principal.team,
        "org": org,
        "issuer": identity.issuer if identity is not None else None,
        "subject": identity.subject if identity is not None else None,
    }
    entries = (await quotas.usage(principal.key_id, principal.team, org)
               if quotas is not None else None)
    return {"object": "usage", "caller": caller, "quotas": entries}
