"""Render a policy's destinations as Kubernetes egress rules: the cluster layer of enforcement.

Three outputs from the one source of truth:

* :func:`networkpolicy`: a ``networking.k8s.io/v1`` NetworkPolicy with one egress rule per
  destination (``ipBlock`` CIDR + TCP ports). Plain NetworkPolicy cannot name hosts: hostname
  destinations are rendered from their ``resolves_to`` networks, from addresses resolved at
  render time (``resolve=...``), or else listed in the ``sovereign-gateway/unenforced-fqdns``
  annotation and left to the Cilium variant.
* :func:`cilium_networkpolicy`: a ``cilium.io/v2`` CiliumNetworkPolicy using ``toCIDR`` and
  ``toFQDNs`` (with the DNS visibility rule ``toFQDNs`` needs).
* :func:`helm_values`: ``{"egress": {"destinations": [...]}}`` for the Helm chart: a list of
  ``{id, cidrs, ports: [{port, protocol: TCP}], fqdn}`` sorted by id (the contract with the
  chart's ``values.schema.json``).

Nothing here ever emits ``0.0.0.0/0`` or ``::/0``; such a destination raises
:class:`~policy.errors.RenderError`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .addresses import IPNetwork, always_denied_reason, parse_ip
from .errors import RenderError
from .evaluate import Policy
from .model import Destination

#: Resolve ``(hostname, port)`` to address strings at render time.
RenderResolver = Callable[[str, int], list[str]]

REVISION_ANNOTATION = "sovereign-gateway/policy-revision"
FQDN_ANNOTATION = "sovereign-gateway/unenforced-fqdns"


@dataclass(frozen=True, slots=True)
class RenderedDestination:
    """One destination as the cluster sees it.

    Attributes:
        id: destination id.
        cidrs: networks as strings (``10.0.0.0/24``), sorted, never ``/0``.
        ports: TCP ports, sorted.
        fqdn: hostname for hostname destinations, else ``None``.
    """

    id: str
    cidrs: tuple[str, ...]
    ports: tuple[int, ...]
    fqdn: str | None


def _check(dest_id: str, net: IPNetwork) -> str:
    if net.prefixlen == 0:
        raise RenderError(
            f"destination {dest_id}: {net} would allow every address; refusing to render it"
        )
    return str(net)


def rendered_destinations(
    policy: Policy, resolve: RenderResolver | None = None
) -> list[RenderedDestination]:
    """Return every destination with its CIDRs and ports, sorted by id.

    Args:
        policy: the policy.
        resolve: when given, hostname destinations without ``resolves_to`` are resolved now
            and rendered as /32 or /128 blocks (a snapshot: DNS may change later).

    Raises:
        RenderError: a destination covers every address, or resolves to an always-denied one.
    """
    out: list[RenderedDestination] = []
    for d in sorted(policy.document.destinations, key=lambda d: d.id):
        ep = d.endpoint
        nets: list[IPNetwork] = []
        if ep.network is not None:
            nets = [ep.network]
        elif ep.resolves_to:
            nets = list(ep.resolves_to)
        elif resolve is not None and ep.hostname is not None:
            nets = _resolved(d, resolve)
        cidrs = tuple(sorted({_check(d.id, n) for n in nets}))
        out.append(RenderedDestination(d.id, cidrs, tuple(sorted(ep.ports)), ep.hostname))
    return out


def _resolved(d: Destination, resolve: RenderResolver) -> list[IPNetwork]:
    host = d.endpoint.hostname
    assert host is not None
    try:
        addresses = resolve(host, min(d.endpoint.ports))
    except OSError as exc:
        raise RenderError(f"destination {d.id}: cannot resolve {host}: {exc}") from exc
    nets: list[IPNetwork] = []
    for text in addresses:
        ip = parse_ip(text)
        if ip is None:
            raise RenderError(f"destination {d.id}: {host} resolved to {text!r}")
        bad = always_denied_reason(ip)
        if bad is not None:
            raise RenderError(f"destination {d.id}: {host} resolved to {ip} ({bad})")
        nets.append(ipaddress.ip_network(ip))
    if not nets:
        raise RenderError(f"destination {d.id}: {host} resolved to no address")
    return nets


def _metadata(policy: Policy, name: str, namespace: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"app.kubernetes.io/managed-by": "sovereign-gateway-policy"},
        "annotations": {REVISION_ANNOTATION: policy.revision},
    }
    if namespace:
        meta["namespace"] = namespace
    return meta


def _dns_peer(dns_namespace: str, dns_labels: dict[str, str]) -> dict[str, Any]:
    return {
        "namespaceSelector": {
            "matchLabels": {"kubernetes.io/metadata.name": dns_namespace}
        },
        "podSelector": {"matchLabels": dict(dns_labels)},
    }


def networkpolicy(
    policy: Policy,
    *,
    name: str = "sovereign-gateway-egress",
    namespace: str | None = None,
    pod_selector: dict[str, str] | None = None,
    resolve: RenderResolver | None = None,
    dns_namespace: str = "kube-system",
    dns_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Return a Kubernetes NetworkPolicy allowing egress to the policy's destinations only.

    Args:
        policy: the policy.
        name: ``metadata.name``.
        namespace: ``metadata.namespace`` (omitted when ``None``).
        pod_selector: labels of the gateway pods (default ``app.kubernetes.io/name:
            sovereign-gateway``).
        resolve: resolve hostname destinations without ``resolves_to`` at render time.
        dns_namespace: namespace of the cluster DNS (allowed on port 53 when any destination is
            a hostname).
        dns_labels: pod labels of the cluster DNS (default ``k8s-app: kube-dns``).

    Returns:
        The NetworkPolicy as a dict (Kubernetes API ``networking.k8s.io/v1``).

    Raises:
        RenderError: see :func:`rendered_destinations`.
    """
    rendered = rendered_destinations(policy, resolve)
    egress: list[dict[str, Any]] = []
    unenforced: list[str] = []
    for r in rendered:
        if not r.cidrs:
            unenforced.append(f"{r.fqdn}:{','.join(map(str, r.ports))}")
            continue
        egress.append({
            "to": [{"ipBlock": {"cidr": c}} for c in r.cidrs],
            "ports": [{"protocol": "TCP", "port": p} for p in r.ports],
        })
    if any(r.fqdn for r in rendered):
        egress.append({
            "to": [_dns_peer(dns_namespace, dns_labels or {"k8s-app": "kube-dns"})],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        })
    meta = _metadata(policy, name, namespace)
    if unenforced:
        meta["annotations"][FQDN_ANNOTATION] = " ".join(unenforced)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {
                "matchLabels": dict(pod_selector or {"app.kubernetes.io/name": "sovereign-gateway"})
            },
            "policyTypes": ["Egress"],
            "egress": egress,
        },
    }


def cilium_networkpolicy(
    policy: Policy,
    *,
    name: str = "sovereign-gateway-egress",
    namespace: str | None = None,
    pod_selector: dict[str, str] | None = None,
    dns_namespace: str = "kube-system",
    dns_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Return a CiliumNetworkPolicy (``cilium.io/v2``): CIDRs via ``toCIDR``, hosts via ``toFQDNs``.

    Raises:
        RenderError: see :func:`rendered_destinations`.
    """
    rendered = rendered_destinations(policy)
    egress: list[dict[str, Any]] = []
    fqdns: list[str] = []
    for r in rendered:
        ports = [{"ports": [{"port": str(p), "protocol": "TCP"} for p in r.ports]}]
        if r.fqdn is not None:
            fqdns.append(r.fqdn)
            egress.append({"toFQDNs": [{"matchName": r.fqdn}], "toPorts": ports})
        if r.cidrs:
            egress.append({"toCIDR": list(r.cidrs), "toPorts": ports})
    if fqdns:
        labels = {f"k8s:{k}": v for k, v in (dns_labels or {"k8s-app": "kube-dns"}).items()}
        labels["k8s:io.kubernetes.pod.namespace"] = dns_namespace
        egress.append({
            "toEndpoints": [{"matchLabels": labels}],
            "toPorts": [{
                "ports": [{"port": "53", "protocol": "ANY"}],
                "rules": {"dns": [{"matchName": f} for f in sorted(set(fqdns))]},
            }],
        })
    return {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": _metadata(policy, name, namespace),
        "spec": {
            "endpointSelector": {
                "matchLabels": dict(pod_selector or {"app.kubernetes.io/name": "sovereign-gateway"})
            },
            "egress": egress,
        },
    }


def helm_values(policy: Policy, resolve: RenderResolver | None = None) -> dict[str, Any]:
    """Return the Helm chart values ``{"egress": {"destinations": [...]}}``, sorted by id.

    Raises:
        RenderError: see :func:`rendered_destinations`.
    """
    return {
        "egress": {
            "destinations": [
                {
                    "id": r.id,
                    "cidrs": list(r.cidrs),
                    "ports": [{"port": p, "protocol": "TCP"} for p in r.ports],
                    "fqdn": r.fqdn,
                }
                for r in rendered_destinations(policy, resolve)
            ]
        }
    }
