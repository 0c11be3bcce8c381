"""A JWKS document that cannot be used is refused whole, as one ``JwksRefused`` naming its
source and the key, wherever it comes from, and the keys in use stay:

* parsing: whatever the JSON parser, PyJWT or ``cryptography`` would raise (a member of the
  wrong type, a deep nesting, ...) is that one error (tried by hand and generated);
* ``jwks_uri``: neither start-up nor the refresh loop ends on such a document (or on a bug
  in a fetch); the next good document is loaded, and each outcome is counted;
* a live reload (SIGHUP, real ``gateway serve``) with such a ``jwks_file`` is refused with
  its ``config.reload_refused`` record, and ``gateway check-config`` names the problem.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.assembly import assemble
from gateway.errors import ConfigError
from gateway.identity.auth import IdentityAuthenticator
from gateway.identity.errors import JwksRefused
from gateway.identity.fetch import JwksFetcher
from gateway.identity.jwks import parse_jwks
from tests.gateway.helpers import Sim, config, start_sim
from tests.gateway.identity.jwtkit import SigningKey, identity_section, write_jwks
from tests.gateway.identity.test_jwks_uri import JwksServer, _settings, jwks_server  # noqa: F401
from tests.gateway.test_live_reload import Served

RSA = SigningKey("rsa-1")
EC = SigningKey("ec-1", kind="EC")
SOURCE = "jwks_uri http://127.0.0.1:1/certs"
BAD_N = b'{"keys":[{"kty":"RSA","kid":"a","n":123,"e":"AQAB"}]}'


@pytest.mark.parametrize(("doc", "algorithm", "index", "problem"), [
    (BAD_N, "RS256", 0, "n missing or not base64url"),
    (b'{"keys":[{"kty":"EC","kid":"a","crv":"P-256","x":1,"y":2}]}', "ES256", 0, "x, y"),
    (b'{"keys":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "RS256", None, "nested"),
    (json.dumps({"keys": [RSA.jwk, {**RSA.jwk, "kid": "b", "n": "AQAB"}]}).encode(), "RS256",
     1, "not a usable RS256 key"),
    (json.dumps({"keys": [{**EC.jwk, "x": "AAAA"}]}).encode(), "ES256", 0,
     "not a usable ES256 key"),
    (json.dumps({"keys": [{**RSA.jwk, "alg": ["RS256"]}]}).encode(), "RS256", 0,
     "'alg' is not a string"),
    (json.dumps({"keys": [{**RSA.jwk, "kty": 7}]}).encode(), "RS256", 0, "'kty' is not"),
    (json.dumps({"keys": [{**EC.jwk, "crv": {"P-256": 1}}]}).encode(), "ES256", 0, "'crv'"),
    (b'{"keys":[' + b'"x",' * 10 + b"1]}", "RS256", 0, "not a JSON object"),
    (b"\xff\xfe", "RS256", None, "not JSON"),
    (b'{"keys": [' + b" " * (1 << 20) + b"]}", "RS256", None, "larger than"),
], ids=["rsa-n-int", "ec-xy-int", "deep-nesting", "rsa-n-too-short", "ec-x-off-curve",
        "alg-list", "kty-int", "crv-object", "key-not-object", "not-utf8", "too-large"])
def test_a_jwks_that_cannot_be_built_is_one_refusal_naming_source_and_key(
        doc: bytes, algorithm: str, index: int | None, problem: str) -> None:
    with pytest.raises(JwksRefused) as info:
        parse_jwks(doc, (algorithm,), SOURCE)
    exc = info.value
    assert isinstance(exc, ConfigError) and exc.code == "jwks_invalid"
    assert exc.source == SOURCE and exc.index == index
    at = SOURCE if index is None else f"{SOURCE}: keys[{index}]"
    assert str(exc).startswith(at + ": ") and problem in str(exc), str(exc)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=3),
    max_leaves=8)
_B64 = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
               max_size=90)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from([RSA.jwk, EC.jwk]),
       member=st.sampled_from(["kty", "kid", "crv", "alg", "use", "n", "e", "x", "y",
                               "key_ops", "x5c"]),
       value=_JSON | _B64)
def test_any_value_of_any_member_is_a_key_or_a_refusal(base: dict[str, Any], member: str,
                                                       value: Any) -> None:
    """Generated: one member of a good RSA or EC key replaced by any JSON value (or any
    base64url text). The document parses into keys or is refused as ``JwksRefused``; nothing
    else escapes (PyJWT's InvalidKeyError, TypeError, ValueError, ...)."""
    doc = json.dumps({"keys": [{**base, member: value}]}).encode()
    try:
        keyset = parse_jwks(doc, ("RS256", "ES256"), SOURCE)
    except JwksRefused as exc:
        assert str(exc).startswith(SOURCE)
    else:
        assert keyset.keys


def _served_by(body: bytes) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(200, content=body)


def test_a_bad_document_never_ends_the_refresh_loop(jwks_server: JwksServer) -> None:  # noqa: F811
    """Good at start, a document PyJWT cannot build on the next refreshes, good again: the
    loop keeps fetching at its cap, keeps the keys in use meanwhile and loads the new ones
    (the tester's ``repro/jwks_uri_repro.sh``: the loop died at the bad document)."""
    first, second = SigningKey("k-1"), SigningKey("k-2")
    jwks_server.body = json.dumps({"keys": [first.jwk]}).encode()
    fetcher = JwksFetcher("iss", f"http://127.0.0.1:{jwks_server.port}/jwks", ("RS256",), 0.2,
                          httpx.AsyncClient)

    async def go() -> None:
        await fetcher.start()
        try:
            good = fetcher.keyset
            assert good is not None and ("k-1", "RS256") in good.keys
            jwks_server.body = BAD_N
            await _until(lambda: fetcher.outcomes["refused"] >= 2)
            assert fetcher.keyset is good  # the keys in use stay
            assert "keys[0]" in (fetcher.last_error or "")
            jwks_server.body = json.dumps({"keys": [second.jwk]}).encode()
            await _until(lambda: fetcher.keyset is not None and fetcher.keyset is not good)
            assert fetcher.keyset is not None and ("k-2", "RS256") in fetcher.keyset.keys
            assert fetcher.failures_in_a_row == 0 and fetcher.last_error is None
            rows = dict(fetcher.outcome_rows())
            assert rows[("iss", "ok")] >= 2 and rows[("iss", "refused")] >= 2
        finally:
            await fetcher.stop()

    asyncio.run(go())


def test_a_failure_nobody_foresaw_is_logged_counted_and_retried_with_backoff(
        caplog: pytest.LogCaptureFixture) -> None:
    """A fetch that raises something no ``except`` names (here the transport raises a
    ``RuntimeError``) neither fails the start nor ends the loop: it is logged with its
    traceback, counted as ``error``, and retried after a doubling wait."""
    calls: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(time.monotonic())
        if len(calls) <= 3:
            raise RuntimeError("a bug in a fetch")
        return httpx.Response(200, content=json.dumps({"keys": [RSA.jwk]}).encode())

    fetcher = JwksFetcher("iss", "http://idp.test/certs", ("RS256",), 0.1,
                          lambda: httpx.AsyncClient(transport=httpx.MockTransport(handler)))

    async def go() -> None:
        await fetcher.start()  # raises nothing
        try:
            assert fetcher.keyset is None and fetcher.outcomes["error"] == 1
            await _until(lambda: fetcher.keyset is not None)
        finally:
            await fetcher.stop()

    asyncio.run(go())
    assert fetcher.outcomes == {"error": 3, "ok": 1}
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2 and gaps[2] >= 0.4, gaps  # 0.1, 0.2, 0.4 s
    assert sum("a bug in a fetch" in r.getMessage() or (r.exc_info and "a bug" in str(
        r.exc_info[1])) for r in caplog.records) >= 3


def test_start_up_serves_with_the_pinned_keys_when_jwks_uri_is_bad(
        tmp_path: Path, jwks_server: JwksServer) -> None:  # noqa: F811
    pinned = SigningKey("pinned-1")
    jwks_server.body = BAD_N
    auth = assemble(_settings(tmp_path, pinned, jwks_server.port)).authenticator
    assert isinstance(auth, IdentityAuthenticator)

    async def go() -> None:
        await auth.startup()  # raised InvalidKeyError: startup_failed
        try:
            assert "keys[0]" in (auth.fetchers[0].last_error or "")
            assert auth.authenticate(pinned.token()).identity is not None
        finally:
            await auth.shutdown()

    asyncio.run(go())


async def _until(cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def test_a_reload_with_a_bad_jwks_file_is_refused_and_audited(
        serve_asgi: Callable[..., Any], tmp_path: Path) -> None:
    """SIGHUP with a re-pinned ``jwks_file`` PyJWT cannot build: ``config.reload_refused``
    naming the file and the key, and the running keys keep verifying; ``check-config`` on that
    file prints the same problem (it printed ``internal_error ... this is a bug``)."""
    sim: Sim = start_sim(serve_asgi)
    signer = SigningKey("rsa-1")
    jwks = tmp_path / "jwks.json"
    section = identity_section(jwks, write_jwks(jwks, signer))
    section["rules"][0]["models"] = ["llama-3.1-8b"]
    gw = Served(tmp_path, config([sim.url], identity=section))
    try:
        with openai.OpenAI(base_url=gw.url + "/v1", api_key=signer.token(), max_retries=0,
                           timeout=30) as client:
            assert client.models.list().data
            jwks.write_bytes(BAD_N)
            cfg = json.loads(json.dumps(gw.cfg))
            cfg["identity"]["issuers"][0]["jwks_sha256"] = hashlib.sha256(BAD_N).hexdigest()
            gw.write(cfg)
            record = gw.hup_and_wait("config.reload_refused")
            assert any("jwks_file" in p and "keys[0]" in p and "n missing" in p
                       for p in record["problems"]), record["problems"]
            assert client.models.list().data  # the keys loaded at start still verify
        res = subprocess.run([sys.executable, "-m", "gateway.cli", "check-config",
                              str(gw.path)], capture_output=True, text=True, check=False,
                             env={**os.environ, "VLLM_KEY": "k"}, timeout=120)
        out = res.stdout + res.stderr
        assert res.returncode == 1, out
        assert "keys[0]" in out and "jwks_file" in out and "bug" not in out, out
    finally:
        gw.stop()


def test_gateway_serve_starts_with_a_bad_jwks_uri_document_and_counts_it(
        serve_asgi: Callable[..., Any], tmp_path: Path,
        jwks_server: JwksServer) -> None:  # noqa: F811
    """A real ``gateway serve`` whose ``jwks_uri`` answers a document PyJWT cannot build
    starts (it failed with ``startup_failed``), verifies with the pinned keys, and counts the
    refusal in ``sg.gateway.identity.jwks_fetches`` on the admin ``/metrics``."""
    from tests.gateway.mcp_gateway.harness import start_gateway
    from vllm_sim import SimConfig
    from vllm_sim import create_app as create_sim

    sim = serve_asgi(create_sim(SimConfig(models=["m"])))
    jwks_server.body = BAD_N
    signer = SigningKey("rsa-1")
    jwks = tmp_path / "jwks.json"
    section = identity_section(jwks, write_jwks(jwks, signer),
                               jwks_uri=f"http://127.0.0.1:{jwks_server.port}/certs",
                               jwks_refresh_s=600)
    section["rules"][0]["models"] = ["m"]

    def cfg_extra(cfg: dict[str, Any]) -> None:
        cfg["identity"] = section
        cfg.pop("mcp")

    gw = start_gateway(tmp_path, sim.url, {}, {"idp": jwks_server.port}, cfg_extra=cfg_extra)
    try:
        with openai.OpenAI(base_url=gw.url + "/v1", api_key=signer.token(), max_retries=0,
                           timeout=30) as client:
            assert client.models.list().data
        samples = gw.metrics("sg_gateway_identity_jwks_fetches")
        refused = [v for labels, v in samples.items()
                   if ("sg_outcome", "refused") in labels]
        assert refused == [1.0], samples
        assert jwks_server.hits == 1
    finally:
        gw.stop()
