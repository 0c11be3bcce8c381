"""Start-up helpers for the gateway: bind replicas to destinations, start the guard safely.

The gateway config names a destination for every replica (``replicas[].destination``) and has a
``policy: {file, guard: enforce|monitor|off}`` section. At start-up the gateway should:

1. load the policy (:meth:`~policy.evaluate.Policy.from_file`);
2. :func:`check_binding` every replica: its URL must lie inside the destination it names, or a
   replica labelled "EU, no-retention" could point anywhere the policy allows for something else;
3. :func:`start_guard` before opening any connection: it refuses uvloop, installs the audit hook
   and runs the self-test, raising :class:`~policy.errors.GuardSelfTestFailed` if the hook does
   not block.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal
from urllib.parse import urlsplit

from .addresses import parse_host
from .egress import PinStore
from .errors import GuardSelfTestFailed, PolicyError
from .evaluate import Policy
from .guard import SELF_TEST_TARGET, EgressEvent, EgressGuard
from .model import DEFAULT_PORTS

GuardMode = Literal["enforce", "monitor", "off"]


class BindingError(PolicyError):
    """A replica URL does not lie inside the destination it names."""

    code = "destination_mismatch"


def check_binding(policy: Policy, url: str, destination_id: str) -> None:
    """Check that ``url`` (a replica's base URL) is inside destination ``destination_id``.

    Args:
        policy: the policy.
        url: the replica URL (``http://10.0.0.11:8000``).
        destination_id: the destination the replica names.

    Raises:
        UnknownDestination: no such destination.
        BindingError: the URL's host or port is not the destination's.
    """
    dest = policy.destination(destination_id)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or DEFAULT_PORTS.get(scheme)
    try:
        host = parse_host(parts.hostname or "")
    except ValueError:
        raise BindingError(f"replica {url}: invalid host") from None
    ep = dest.endpoint
    if port not in ep.ports:
        raise BindingError(
            f"replica {url}: port {port} is not a port of destination {dest.id} "
            f"({', '.join(map(str, sorted(ep.ports)))})"
        )
    if isinstance(host, str):
        ok = ep.hostname == host
    else:
        ok = ep.network is not None and host.version == ep.network.version and host in ep.network
    if not ok:
        where = ep.hostname or str(ep.network)
        raise BindingError(f"replica {url}: host is not destination {dest.id} ({where})")


def replica_url(policy: Policy, destination_id: str) -> str:
    """The URL a replica naming only ``destination_id`` is served at: the destination's ``url``.

    Only one ``http://`` or ``https://`` server root can be a replica's URL: not a
    ``host``/``cidr`` destination (where the process may connect, not which server), not
    another scheme, not an API base ending in ``/v1``. The gateway's config loader and
    ``policy explain --config`` both ask here, so they cannot disagree.

    Args:
        policy: the policy.
        destination_id: the destination the replica names.

    Returns:
        The destination's ``url`` without a trailing ``/`` (``http://10.0.0.11:8000``).

    Raises:
        UnknownDestination: no such destination.
        BindingError: the destination is not one ``http(s)://`` server root.
    """
    dest = policy.destination(destination_id)
    if dest.url is None:
        form = "host" if dest.host is not None else "cidr"
        raise BindingError(f"destination {destination_id!r} is given as a {form}, not a url: "
                           "give this replica's url (http://HOST:PORT)")
    parts = urlsplit(dest.url)
    if parts.scheme.lower() not in ("http", "https"):
        raise BindingError(f"destination {destination_id!r} has url {dest.url!r}, not an "
                           "http:// or https:// server: give this replica's url")
    if parts.path.rstrip("/").endswith("/v1"):
        raise BindingError(f"destination {destination_id!r} has url {dest.url!r}, an API base, "
                           "not a server root: give this replica's url without /v1")
    return dest.url.rstrip("/")


def _uvloop_running() -> bool:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False
    return type(loop).__module__.startswith("uvloop")


def start_guard(
    policy: Policy,
    mode: GuardMode = "enforce",
    on_event: Callable[[EgressEvent], None] | None = None,
    *,
    pins: PinStore | None = None,
    self_test_target: tuple[str, int] = SELF_TEST_TARGET,
) -> EgressGuard | None:
    """Install the process guard and prove it works; ``None`` when ``mode`` is ``"off"``.

    Call it from synchronous start-up code (before the server's event loop runs) or from the
    lifespan of a server on the standard asyncio loop.

    Raises:
        GuardSelfTestFailed: uvloop is running, or the self-test connection was not blocked
            (the guard is uninstalled again before raising).
    """
    if mode == "off":
        return None
    if _uvloop_running():
        raise GuardSelfTestFailed(
            "the egress guard cannot see uvloop's connections: run the standard asyncio loop "
            "(uvicorn --loop asyncio) while the guard is on"
        )
    guard = EgressGuard(policy, mode, on_event, pins=pins).install()
    try:
        guard.self_test(self_test_target)
    except BaseException:
        guard.uninstall()
        raise
    return guard
