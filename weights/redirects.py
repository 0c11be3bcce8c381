"""Which redirects of the hub are followed: never https to http, only to allowed hosts.

The Hub answers a download of an LFS or Xet-stored file (``/resolve/``) with a redirect to its
content hosts (``cdn-lfs.hf.co``, ``cas-bridge.xethub.hf.co``, ...). The staging host's
firewall must let those through, so the hosts a redirect may lead to are the operator's to
name (``weights pull --redirect-host``, ``WEIGHTS_REDIRECT_HOSTS``), with
:data:`DEFAULT_REDIRECT_HOSTS` when not named; the endpoint's own host is always allowed.
A redirect to any other host, to a scheme other than http(s), or from https to plain http
raises :class:`weights.errors.RedirectRefusedError` before a byte is sent there.

No network code lives here (pure policy, no huggingface_hub import); :mod:`weights.hub` calls
:meth:`RedirectPolicy.check` for every redirect its HTTP client is about to follow.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from weights.errors import RedirectRefusedError, WeightsError

__all__ = ["DEFAULT_REDIRECT_HOSTS", "REDIRECT_HOSTS_SETTING", "RedirectPolicy"]

DEFAULT_REDIRECT_HOSTS: tuple[str, ...] = ("*.hf.co",)
"""The Hub's content hosts (``cdn-lfs.hf.co``, ``cdn-lfs-us-1.hf.co``,
``cas-bridge.xethub.hf.co``, ...): any host under ``hf.co``, which the Hub owns."""

REDIRECT_HOSTS_SETTING = "--redirect-host (WEIGHTS_REDIRECT_HOSTS)"
"""How the operator names the allowed redirect hosts (quoted in every refusal)."""

_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_HOST_PATTERN = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})*")


def _check_pattern(pattern: str) -> str:
    host = pattern.strip().lower().rstrip(".")
    if _HOST_PATTERN.fullmatch(host) is None:
        raise WeightsError(
            f"redirect host {pattern!r} must be a host name (cdn.example.org) or *.domain "
            f"(*.example.org), without scheme, port or path",
            hint=f"fix {REDIRECT_HOSTS_SETTING}",
        )
    return host


@dataclass(frozen=True)
class RedirectPolicy:
    """The redirects a hub client follows.

    Args:
        endpoint: The hub's base URL; its host is always allowed as a target.
        hosts: Further allowed target hosts: exact names, or ``*.domain`` for any host under
            ``domain`` (not ``domain`` itself); case-insensitive.

    Raises:
        WeightsError: On construction, a pattern that is not a host name or ``*.domain``.
    """

    endpoint: str
    hosts: tuple[str, ...] = DEFAULT_REDIRECT_HOSTS

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", tuple(_check_pattern(h) for h in self.hosts))

    @classmethod
    def of(cls, endpoint: str, hosts: Iterable[str] | None) -> RedirectPolicy:
        """The policy for ``endpoint`` with ``hosts`` (``None`` or empty: the defaults)."""
        named = tuple(hosts or ())
        return cls(endpoint, named or DEFAULT_REDIRECT_HOSTS)

    def allows_host(self, host: str) -> bool:
        """True if a redirect may lead to ``host`` (the endpoint's host or an allowed one)."""
        host = host.lower().rstrip(".")
        if host == (urlsplit(self.endpoint).hostname or "").lower():
            return True
        for pattern in self.hosts:
            if pattern.startswith("*."):
                if host.endswith(pattern[1:]):
                    return True
            elif host == pattern:
                return True
        return False

    def check(self, source: str, target: str) -> None:
        """Refuse the redirect from ``source`` to ``target`` unless this policy allows it.

        Args:
            source: The URL that answered with a redirect.
            target: The absolute URL it redirects to (``Location`` resolved against ``source``).

        Raises:
            RedirectRefusedError: ``target`` is not http(s), downgrades https to http, or its
                host is neither the endpoint's nor an allowed one. The message names the host
                and the setting, never the query (signed URLs carry credentials there).
        """
        src, dst = urlsplit(source), urlsplit(target)
        host = (dst.hostname or "").lower()
        shown = f"{dst.scheme}://{dst.netloc.rpartition('@')[2]}{dst.path}"
        if dst.scheme not in ("http", "https") or not host:
            raise RedirectRefusedError(
                f"the hub redirected to {shown!r}, which is not an http(s) URL", host=host)
        if src.scheme == "https" and dst.scheme != "https":
            raise RedirectRefusedError(
                f"the hub redirected from https to plain http ({shown}): refused, the "
                f"transfer would lose its encryption and server authentication",
                host=host,
                hint=f"have {host} served over https, or use an endpoint that does not redirect",
            )
        if not self.allows_host(host):
            allowed = ", ".join(self.hosts)
            raise RedirectRefusedError(
                f"the hub redirected to host {host!r} ({shown}), which is not an allowed "
                f"redirect host (allowed: the endpoint's host, {allowed})",
                host=host,
                hint=f"if the operator's firewall allows {host}, add it with "
                     f"{REDIRECT_HOSTS_SETTING}",
            )
