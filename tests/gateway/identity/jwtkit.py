"""Test-side token minting: real keys (cryptography), real JWS (PyJWT), and hand-made bad
tokens (``alg: none``, HMAC with the RSA public key) that no library would sign."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

ISSUER = "https://idp.test/realms/ai"
AUDIENCE = "sovereign-gateway"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class SigningKey:
    """A private key with its kid and public JWK."""

    def __init__(self, kid: str, kind: str = "RSA") -> None:
        self.kid = kid
        self.alg = "RS256" if kind == "RSA" else "ES256"
        self.private: Any = (rsa.generate_private_key(public_exponent=65537, key_size=2048)
                             if kind == "RSA" else ec.generate_private_key(ec.SECP256R1()))
        algo = jwt.algorithms.RSAAlgorithm if kind == "RSA" else jwt.algorithms.ECAlgorithm
        self.jwk = {**json.loads(algo.to_jwk(self.private.public_key())), "kid": kid,
                    "use": "sig"}
        self.public_pem = self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def token(self, headers: dict[str, Any] | None = None, **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice@example.org", "iat": now,
                "exp": now + 300, "groups": ["ml-engineers"]}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, self.private, algorithm=self.alg,
                          headers={"kid": self.kid, **(headers or {})})


def write_jwks(path: Path, *keys: SigningKey) -> str:
    """Write the JWKS of ``keys``; return its sha256 hex (the pin)."""
    data = json.dumps({"keys": [k.jwk for k in keys]}).encode()
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def unsigned(kid: str, **claims: Any) -> str:
    now = int(time.time())
    header = b64(json.dumps({"alg": "none", "kid": kid}).encode())
    body = b64(json.dumps({"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "iat": now,
                           "exp": now + 300, **claims}).encode())
    return f"{header}.{body}."


def hmac_with_public_key(key: SigningKey) -> str:
    """HS256 keyed with the RSA public key's PEM (the algorithm-confusion attack)."""
    now = int(time.time())
    header = b64(json.dumps({"alg": "HS256", "kid": key.kid, "typ": "JWT"}).encode())
    body = b64(json.dumps({"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "iat": now,
                           "exp": now + 300, "groups": ["ml-engineers"]}).encode())
    mac = hmac.new(key.public_pem, f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64(mac)}"


def identity_section(jwks: Path, pin: str, **issuer: Any) -> dict[str, Any]:
    return {
        "issuers": [{"issuer": ISSUER, "audiences": [AUDIENCE], "algorithms": ["RS256", "ES256"],
                     "jwks_file": str(jwks), "jwks_sha256": pin, "clock_skew_s": 5, **issuer}],
        "rules": [
            {"id": "ml", "match": {"groups": "ml-engineers"}, "team": "ml",
             "models": ["llama-3.1-8b"], "data_class": "internal"},
        ],
    }
