"""Zero-trust egress policy: a prompt only goes where the operator's policy allows.

Public API (other packages import only these names):

* :class:`Policy` (``from_file``/``from_text``, ``evaluate``, ``resolve_class``, ``explain``),
  :class:`Principal`, :class:`Decision`;
* :class:`EgressGuard`, :class:`EgressEvent` (process layer, ``sys.addaudithook``);
* :func:`make_connector` (every connection checked at connect time,
  :func:`checked_socket_factory`), :func:`make_session`, :class:`PolicyResolver` (transport
  layer, aiohttp), :func:`redirect_refused` / :data:`REDIRECT_STATUSES`,
  :func:`make_httpx_client`, :class:`PolicyAsyncTransport` (httpx, openai SDK);
* :class:`EgressMatcher`, :class:`PinStore` (address checks shared by both),
  :func:`check_target` (the one egress check of a host and port, also used for URL arguments
  of MCP tool calls);
* :func:`litellm_env`, :func:`import_litellm` (litellm without hidden egress);
* :func:`check_binding`, :func:`start_guard` (gateway start-up), :func:`policy_middleware`
  (the gateway's ``RoutePolicy`` is ``gateway.egress.PolicyRoutes``, over :meth:`Policy.select`);
* :class:`PiiPolicy` / :class:`PiiVerdict` (``Policy.pii``; sensitive data in prompts, the
  ``policy.pii`` subpackage with :func:`policy.pii.scan`);
* :func:`check_tool_access`, :func:`check_access` (the MCP tool, prompt and resource
  allow/deny globs of the gateway's ``mcp.access``);
* the :class:`PolicyError` tree (``errors`` module docstring).
"""

from typing import TYPE_CHECKING, Any

from .addresses import whole_families
from .egress import EgressMatcher, PinStore, Target, Verdict, check_target
from .errors import (
    ClassChangeForbidden,
    EgressBlocked,
    EgressDenied,
    GuardSelfTestFailed,
    PiiRefused,
    PiiScanFailed,
    PolicyError,
    PolicyFileError,
    RedirectRefused,
    RenderError,
    UnknownDataClass,
    UnknownDestination,
)
from .evaluate import UNSAFE_RULE_ID, Decision, Policy, Principal, Selection
from .guard import SELF_TEST_TARGET, EgressEvent, EgressGuard
from .pii import PiiPolicy, PiiVerdict
from .providers import LITELLM_OFFLINE_ENV, import_litellm, litellm_env
from .runtime import BindingError, GuardMode, check_binding, replica_url, start_guard
from .tools import KINDS, ToolVerdict, check_access, check_tool_access
from .transport import (
    REDIRECT_STATUSES,
    PolicyResolver,
    checked_socket_factory,
    denied_address_socket_factory,
    make_connector,
    make_session,
    policy_middleware,
    redirect_refused,
)

if TYPE_CHECKING:
    from .httpx_transport import (
        DeniedAddressAsyncTransport,
        PolicyAsyncTransport,
        make_httpx_client,
    )

#: The httpx names, imported on first use (PEP 562): httpx imports its command line (click, rich,
#: pygments) with itself, a fifth of the import time of a ``gateway serve`` that never makes an
#: httpx client (only identity ``jwks_uri`` fetches and litellm replicas do, at assembly).
_HTTPX_NAMES = frozenset(
    {"DeniedAddressAsyncTransport", "PolicyAsyncTransport", "make_httpx_client"}
)


def __getattr__(name: str) -> Any:
    """The httpx transport's public names, imported on first access (PEP 562).

    Raises:
        AttributeError: ``name`` is not a public name of the package (nor a loaded submodule).
    """
    if name not in _HTTPX_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import httpx_transport

    return getattr(httpx_transport, name)


__all__ = [
    "KINDS",
    "LITELLM_OFFLINE_ENV",
    "REDIRECT_STATUSES",
    "SELF_TEST_TARGET",
    "UNSAFE_RULE_ID",
    "BindingError",
    "ClassChangeForbidden",
    "Decision",
    "DeniedAddressAsyncTransport",
    "EgressBlocked",
    "EgressDenied",
    "EgressEvent",
    "EgressGuard",
    "EgressMatcher",
    "GuardMode",
    "GuardSelfTestFailed",
    "PiiPolicy",
    "PiiRefused",
    "PiiScanFailed",
    "PiiVerdict",
    "PinStore",
    "Policy",
    "PolicyAsyncTransport",
    "PolicyError",
    "PolicyFileError",
    "PolicyResolver",
    "Principal",
    "RedirectRefused",
    "RenderError",
    "Selection",
    "Target",
    "ToolVerdict",
    "UnknownDataClass",
    "UnknownDestination",
    "Verdict",
    "check_access",
    "check_binding",
    "check_target",
    "check_tool_access",
    "checked_socket_factory",
    "denied_address_socket_factory",
    "import_litellm",
    "litellm_env",
    "make_connector",
    "make_httpx_client",
    "make_session",
    "policy_middleware",
    "redirect_refused",
    "replica_url",
    "start_guard",
    "whole_families",
]
