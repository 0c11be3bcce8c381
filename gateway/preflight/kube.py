"""A read-only Kubernetes API client for the pre-flight: GET nodes, pods, NetworkPolicies.

It talks to exactly one place, the ``server`` of the kubeconfig's current context, with plain
``httpx`` (``trust_env=False``: no proxy variables, no ``.netrc``; redirects are errors). It
only ever sends ``GET``. Credentials come from the kubeconfig (bearer token, client
certificate, CA bundle); the API answers are the evidence, credentials never are.

Resources read (Kubernetes API, ``v1`` and ``networking.k8s.io/v1``)::

    GET /api/v1/namespaces/{ns}/pods?labelSelector=app.kubernetes.io/instance={release}
    GET /api/v1/nodes/{name}                              (each node a release pod runs on)
    GET /apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies
"""

from __future__ import annotations

import base64
import ssl
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml

from gateway.preflight.errors import PreflightInputError

__all__ = ["KubeClient", "KubeConfig", "load_kubeconfig"]


@dataclass(frozen=True, slots=True)
class KubeConfig:
    """The connection facts of one kubeconfig context.

    Attributes:
        server: API server base URL (``https://host:port``).
        ca_pem: CA bundle (PEM bytes), or ``None`` for the system store.
        insecure: ``insecure-skip-tls-verify`` (reported in the evidence).
        token: Bearer token, or ``None``.
        cert_pem: Client certificate (PEM bytes), or ``None``.
        key_pem: Client key (PEM bytes), or ``None``.
        context: Name of the context used.
    """

    server: str
    ca_pem: bytes | None
    insecure: bool
    token: str | None
    cert_pem: bytes | None
    key_pem: bytes | None
    context: str

    def __repr__(self) -> str:  # never print credentials
        return f"KubeConfig(server={self.server!r}, context={self.context!r})"


def _named(items: Any, name: str, what: str, path: Path) -> dict[str, Any]:
    for item in items or ():
        if isinstance(item, dict) and item.get("name") == name:
            value = item.get(what)
            if isinstance(value, dict):
                return value
    raise PreflightInputError(f"{path}: no {what} named {name!r}")


def _data(obj: dict[str, Any], key: str, base: Path) -> bytes | None:
    if isinstance(obj.get(key + "-data"), str):
        return base64.b64decode(obj[key + "-data"])
    if isinstance(obj.get(key), str):
        file = Path(obj[key])
        file = file if file.is_absolute() else base / file
        try:
            return file.read_bytes()
        except OSError as exc:
            raise PreflightInputError(f"kubeconfig {key}: cannot read {file}: {exc}") from exc
    return None


def load_kubeconfig(path: Path, context: str | None = None) -> KubeConfig:
    """Read one context of a kubeconfig file.

    Args:
        path: The kubeconfig (YAML).
        context: Context name; default ``current-context``.

    Raises:
        PreflightInputError: Unreadable file, unknown context/cluster/user, no server URL,
            or an auth method other than token / client certificate (exec plugins are not run).
    """
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PreflightInputError(f"cannot read kubeconfig {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise PreflightInputError(f"{path}: a kubeconfig must be a YAML mapping")
    name = context or doc.get("current-context")
    if not isinstance(name, str) or not name:
        raise PreflightInputError(f"{path}: no current-context (give --kube-context)")
    ctx = _named(doc.get("contexts"), name, "context", path)
    cluster = _named(doc.get("clusters"), str(ctx.get("cluster")), "cluster", path)
    user = _named(doc.get("users"), str(ctx.get("user")), "user", path) if ctx.get("user") else {}
    server = cluster.get("server")
    parts = urlsplit(server) if isinstance(server, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise PreflightInputError(f"{path}: cluster of context {name!r} has no http(s) server")
    if "exec" in user or "auth-provider" in user:
        raise PreflightInputError(
            f"{path}: user of context {name!r} uses an exec/auth-provider plugin; the pre-flight "
            "runs no plugins: give a kubeconfig with a token or client certificate")
    base = path.parent
    token = user.get("token") if isinstance(user.get("token"), str) else None
    if token is None and isinstance(user.get("tokenFile"), str):
        token = (_data({"t": user["tokenFile"]}, "t", base) or b"").decode().strip() or None
    return KubeConfig(
        server=str(server).rstrip("/"), ca_pem=_data(cluster, "certificate-authority", base),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)), token=token,
        cert_pem=_data(user, "client-certificate", base),
        key_pem=_data(user, "client-key", base), context=name,
    )


class KubeClient:
    """GET-only client of one API server (use as a context manager).

    Args:
        config: From :func:`load_kubeconfig`.
        timeout_s: Per-request timeout, seconds.
    """

    def __init__(self, config: KubeConfig, timeout_s: float = 10.0) -> None:
        self.config = config
        self._timeout_s = timeout_s
        self._client: httpx.Client | None = None

    @contextmanager
    def _ssl(self) -> Iterator[ssl.SSLContext | bool]:
        cfg = self.config
        if not cfg.server.startswith("https"):
            yield False
            return
        ctx = ssl.create_default_context(cadata=cfg.ca_pem.decode() if cfg.ca_pem else None)
        if cfg.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cfg.cert_pem and cfg.key_pem:
            # ssl loads client certificates only from files: a private temporary directory.
            with tempfile.TemporaryDirectory() as tmp:
                cert, key = Path(tmp) / "c.pem", Path(tmp) / "k.pem"
                cert.write_bytes(cfg.cert_pem)
                key.touch(0o600)
                key.write_bytes(cfg.key_pem)
                ctx.load_cert_chain(cert, key)
        yield ctx

    def __enter__(self) -> KubeClient:
        headers = {"accept": "application/json", "user-agent": "sovereign-gateway-preflight"}
        if self.config.token:
            headers["authorization"] = f"Bearer {self.config.token}"
        with self._ssl() as verify:
            self._client = httpx.Client(
                base_url=self.config.server, headers=headers, verify=verify, trust_env=False,
                follow_redirects=False, timeout=self._timeout_s)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        """GET one API path and return the JSON object.

        Raises:
            PreflightInputError: Connection failure, non-200 answer or non-JSON body (the
                message names the path and status).
        """
        if self._client is None:
            raise RuntimeError("use KubeClient as a context manager")
        try:
            resp = self._client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise PreflightInputError(f"kubernetes API {path}: {exc}") from exc
        if resp.status_code != 200:
            raise PreflightInputError(
                f"kubernetes API {path}: HTTP {resp.status_code} {resp.text[:200]}")
        try:
            body = resp.json()
        except ValueError as exc:
            raise PreflightInputError(f"kubernetes API {path}: not JSON") from exc
        if not isinstance(body, dict):
            raise PreflightInputError(f"kubernetes API {path}: not a JSON object")
        return body

    def release_state(self, namespace: str, release: str) -> dict[str, Any]:
        """Pods of the release, their nodes and the namespace's NetworkPolicies.

        Returns:
            ``{"pods": [...], "nodes": {name: node}, "networkpolicies": [...]}`` with the
            API objects as the server returned them.

        Raises:
            PreflightInputError: See :meth:`get`.
        """
        pods = self.get(f"/api/v1/namespaces/{namespace}/pods",
                        {"labelSelector": f"app.kubernetes.io/instance={release}"})
        items = [p for p in pods.get("items") or () if isinstance(p, dict)]
        nodes: dict[str, Any] = {}
        for pod in items:
            node = (pod.get("spec") or {}).get("nodeName")
            if isinstance(node, str) and node and node not in nodes:
                nodes[node] = self.get(f"/api/v1/nodes/{node}")
        nps = self.get(f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies")
        return {"pods": items, "nodes": nodes,
                "networkpolicies": [n for n in nps.get("items") or () if isinstance(n, dict)]}
