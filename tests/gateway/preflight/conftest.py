"""Fixtures of the pre-flight tests: a recorded Kubernetes API on loopback, a socket recorder,
the compliant chart scenario, operator keys.

The Kubernetes API answers are recorded shapes of a real API server (``recorded/``: a
``PodList``, ``Node`` objects and a ``NetworkPolicyList`` of the release rendered from the chart's
vllm scenario with ``compliant-values.yaml``), served by a small ``http.server`` that checks the
bearer token, answers ``Status`` objects for errors as the API server does, and records every
request so tests can assert the client only ever GETs.
"""

from __future__ import annotations

import copy
import json
import ssl
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
RECORDED = HERE / "recorded"
HELM = REPO / ".tools" / "bin" / "helm"
CHART = REPO / "helm" / "sovereign-gateway"
SCENARIO_VALUES = REPO / "tests" / "helm" / "values" / "vllm.yaml"
SCENARIO_POLICY = REPO / "tests" / "helm" / "values" / "policy-vllm.yaml"
COMPLIANT_VALUES = HERE / "compliant-values.yaml"
NAMESPACE = "sovereign-ai"
TOKEN = "kube-token-for-tests-0123456789"  # noqa: S105 - the fake API server's token


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kube: needs a real Kubernetes API server (opt-in: SG_TEST_KUBECONFIG)")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


@dataclass
class FakeKube:
    """The recorded API: edit ``pods``/``nodes``/``networkpolicies`` to plant violations."""

    pods: dict[str, Any]
    nodes: dict[str, Any]
    networkpolicies: dict[str, Any]
    requests: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""

    def answer(self, method: str, target: str, auth: str | None) -> tuple[int, dict[str, Any]]:
        self.requests.append((method, target))
        if auth != f"Bearer {TOKEN}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        if method != "GET":
            return 405, _status(405, "MethodNotAllowed", "read-only test server")
        parts = urlsplit(target)
        path, query = parts.path, parse_qs(parts.query)
        if path == f"/api/v1/namespaces/{NAMESPACE}/pods":
            body = copy.deepcopy(self.pods)
            for sel in query.get("labelSelector", []):
                k, _, v = sel.partition("=")
                body["items"] = [p for p in body["items"]
                                 if p["metadata"].get("labels", {}).get(k) == v]
            return 200, body
        if path == f"/apis/networking.k8s.io/v1/namespaces/{NAMESPACE}/networkpolicies":
            return 200, self.networkpolicies
        if path.startswith("/api/v1/nodes/"):
            name = path.rsplit("/", 1)[1]
            if name in self.nodes:
                return 200, self.nodes[name]
            return 404, _status(404, "NotFound", f'nodes "{name}" not found')
        return 404, _status(404, "NotFound", "the server could not find the requested resource")


def _load(name: str) -> Any:
    return json.loads((RECORDED / name).read_text())


@contextmanager
def serve_kube(tls: ssl.SSLContext | None = None) -> Iterator[FakeKube]:
    """Serve the recorded API on loopback (HTTPS with ``tls``; a verified client certificate
    then authenticates like the bearer token)."""
    kube = FakeKube(_load("pods.json"), _load("nodes.json"), _load("networkpolicies.json"))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._reply("GET")

        def do_POST(self) -> None:
            self._reply("POST")

        def _reply(self, method: str) -> None:
            auth = self.headers.get("authorization")
            peer = getattr(self.connection, "getpeercert", lambda: None)()
            if peer:
                auth = f"Bearer {TOKEN}"
            code, body = kube.answer(method, self.path, auth)
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    scheme = "https" if tls is not None else "http"
    kube.url = f"{scheme}://127.0.0.1:{server.server_address[1]}"
    try:
        yield kube
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def fake_kube() -> Iterator[FakeKube]:
    with serve_kube() as kube:
        yield kube


def write_kubeconfig(path: Path, server: str, token: str = TOKEN) -> Path:
    """A kubeconfig with one context pointing at ``server`` with a bearer token."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "c", "user": "u",
                                                  "namespace": NAMESPACE}}],
    }))
    return path


@pytest.fixture
def operator_key(tmp_path: Path) -> tuple[Path, Path]:
    """The operator's Ed25519 key pair (PEM private key, PEM public key)."""
    key = Ed25519PrivateKey.generate()
    priv, pub = tmp_path / "operator.pem", tmp_path / "operator.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


class SocketRecorder:
    """Records ``socket.connect`` and ``socket.getaddrinfo`` audit events while active."""

    def __init__(self) -> None:
        self.active = False
        self.connects: list[Any] = []
        self.lookups: list[Any] = []

    def hook(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        if event == "socket.connect":
            self.connects.append(args[1])
        elif event == "socket.getaddrinfo":
            self.lookups.append((args[0], args[1]))


_RECORDER = SocketRecorder()
sys.addaudithook(_RECORDER.hook)  # audit hooks cannot be removed: one for the session


@pytest.fixture
def sockets() -> Iterator[SocketRecorder]:
    _RECORDER.connects.clear()
    _RECORDER.lookups.clear()
    yield _RECORDER
    _RECORDER.active = False
