"""Identity benchmark: what a bearer JWT costs per request beside an API key, in one run.

Through the real entry point: a vLLM simulator and a ``gateway serve`` process on loopback
(identity section with one RS256 issuer, its JWKS pinned; the key is parsed once at start, so
every request verifies with a cached key), and one client connection (concurrency 1, HTTP/1.1
keep-alive, raw socket) that alternates an API-key request and a JWT request, so drift in the
machine's load hits all alike. Three credentials: the API key, one JWT sent again and again (as
an SDK does: after its first use the gateway remembers the verified token until its ``exp``),
and a fresh JWT on every request (first use: the full PyJWT verification). Two request kinds:
``GET /v1/models`` (authenticated, no upstream: the auth is the largest share) and a small
non-streamed chat completion.

Reports p50/p99 per credential and the added p99 of each token kind over the key (target:
<= 0.1 ms at concurrency 1), plus the in-process cost of one ``authenticate()`` call of each
(median of repeated calls: the verification itself, without the HTTP path).

Usage::

    .venv/bin/python bench/identity.py                # 2000 requests per credential and kind
    .venv/bin/python bench/identity.py --requests 500 --json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jwt
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = Path(__file__).resolve().parents[1]
ISSUER = "https://idp.bench/realms/ai"
AUDIENCE = "sovereign-gateway"
API_KEY = "sg-bench-identity-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"port {port} did not open")


class Conn:
    """One keep-alive HTTP/1.1 connection; ``request`` returns the latency in ms."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def request(self, raw: bytes) -> tuple[float, int]:
        t0 = time.perf_counter()
        self.sock.sendall(raw)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(rest) < length:
            rest += self.sock.recv(65536)
        self.buf = rest[length:]
        return (time.perf_counter() - t0) * 1000.0, status


def _raw(method: str, path: str, credential: str, body: bytes = b"") -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {credential}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n")
    return head.encode() + body


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _in_process(config: Path, token: str, fresh: list[str], n: int) -> dict[str, float]:
    """Median µs of one authenticate() call per credential (the assembled authenticator)."""
    from gateway.assembly import assemble
    from gateway.config.loader import load

    auth = assemble(load(config, {}), config.parent).authenticator
    out: dict[str, float] = {}
    for name in ("api_key", "jwt_repeat", "jwt_first_use"):
        samples = []
        for i in range(n if name != "jwt_first_use" else min(n, len(fresh))):
            cred = {"api_key": API_KEY, "jwt_repeat": token}.get(name) or fresh[i]
            t0 = time.perf_counter_ns()
            auth.authenticate(cred)
            samples.append((time.perf_counter_ns() - t0) / 1000.0)
        out[name] = statistics.median(samples)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="Per credential and kind.")
    parser.add_argument("--json", action="store_true", help="Machine-readable output.")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="sg-bench-identity-"))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key())),
           "kid": "bench-1", "use": "sig"}
    jwks = json.dumps({"keys": [jwk]}).encode()
    (tmp / "jwks.json").write_bytes(jwks)
    (tmp / "pseudonym.key").write_text(
        __import__("base64").b64encode(os.urandom(32)).decode())
    now = int(time.time())
    def mint(n: int) -> str:
        return jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": f"bench-user-{n}",
                           "iat": now, "exp": now + 3600, "groups": ["bench"]}, key,
                          algorithm="RS256", headers={"kid": "bench-1"})

    token = mint(0)
    fresh = [mint(i + 1) for i in range(2 * (args.requests + 60))]
    sim_port, gw_port = _free_port(), _free_port()
    config = tmp / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "listen": {"host": "127.0.0.1", "port": gw_port},
        "models": [{"name": "m", "replicas": [{"url": f"http://127.0.0.1:{sim_port}"}]}],
        "keys": [{"id": "bench", "sha256": hashlib.sha256(API_KEY.encode()).hexdigest(),
                  "models": ["*"], "team": "bench"}],
        "logging": {"access_log": False},
        "health": {"active": False},
        "identity": {
            "pseudonym_key_file": str(tmp / "pseudonym.key"),
            "issuers": [{"issuer": ISSUER, "audiences": [AUDIENCE], "algorithms": ["RS256"],
                         "jwks_file": str(tmp / "jwks.json"),
                         "jwks_sha256": hashlib.sha256(jwks).hexdigest()}],
            "rules": [{"id": "bench", "match": {"groups": "bench"}, "team": "bench",
                       "models": ["*"]}],
        },
    }))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    sim = subprocess.Popen([sys.executable, "-m", "vllm_sim.cli", "--port",
                            str(sim_port), "--model", "m", "--tokens", "4"], env=env)
    gw = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config",
                           str(config)], env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_port(sim_port, sim)
        _wait_port(gw_port, gw)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 4}).encode()
        kinds = {"models": ("GET", "/v1/models", b""),
                 "chat": ("POST", "/v1/chat/completions", body)}
        conn = Conn(gw_port)
        results: dict[str, Any] = {}
        for kind, (method, path, payload) in kinds.items():
            raws = {"api_key": _raw(method, path, API_KEY, payload),
                    "jwt_repeat": _raw(method, path, token, payload)}
            for cred in raws:  # warm-up
                for _ in range(50):
                    assert conn.request(raws[cred])[1] == 200
            for _ in range(50):
                assert conn.request(_raw(method, path, fresh.pop(), payload))[1] == 200
            lat: dict[str, list[float]] = {"api_key": [], "jwt_repeat": [], "jwt_first_use": []}
            for _ in range(args.requests):
                for cred in lat:
                    raw = (_raw(method, path, fresh.pop(), payload) if cred == "jwt_first_use"
                           else raws[cred])
                    ms, status = conn.request(raw)
                    assert status == 200, status
                    lat[cred].append(ms)
            results[kind] = {
                cred: {"p50_ms": round(_pct(v, 0.5), 4), "p99_ms": round(_pct(v, 0.99), 4)}
                for cred, v in lat.items()
            }
            for cred in ("jwt_repeat", "jwt_first_use"):
                results[kind][cred]["added_p50_ms"] = round(
                    results[kind][cred]["p50_ms"] - results[kind]["api_key"]["p50_ms"], 4)
                results[kind][cred]["added_p99_ms"] = round(
                    results[kind][cred]["p99_ms"] - results[kind]["api_key"]["p99_ms"], 4)
        conn.sock.close()
    finally:
        for proc in (gw, sim):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    results["authenticate_us_median"] = {
        k: round(v, 2) for k, v in _in_process(config, token, fresh or [mint(-1)], 5000).items()}
    results["target_added_p99_ms"] = 0.1
    results["requests_per_credential_and_kind"] = args.requests
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for kind in kinds:
            r = results[kind]
            print(f"{kind}: api_key p50 {r['api_key']['p50_ms']:.3f} p99 "
                  f"{r['api_key']['p99_ms']:.3f} ms")
            for cred in ("jwt_repeat", "jwt_first_use"):
                c = r[cred]
                print(f"  {cred:13s} p50 {c['p50_ms']:.3f} p99 {c['p99_ms']:.3f} ms | added "
                      f"p50 {c['added_p50_ms']:+.3f} p99 {c['added_p99_ms']:+.3f} ms "
                      "(target p99 <= 0.1)")
        a = results["authenticate_us_median"]
        print("authenticate() median: " + ", ".join(f"{k} {v:.1f} us" for k, v in a.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
