"""A quota-store outage tells the client nothing about the store: no host, port or password.

``GET /v1/usage`` answered 503 with the redis client's exception text (``Error 111 connecting
to 127.0.0.1:PORT``): the address of an internal service, to any key holder. Now both the
relay and ``/v1/usage`` answer one generic message and the detail goes to the log. Real
gateway on loopback, Redis URL on a port nobody listens on, httpx and the openai SDK.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from gateway.app import create_app
from gateway.assembly import assemble
from tests.conftest import free_port
from tests.gateway.helpers import KEY_A, Sim, settings


def test_usage_and_relay_503_carry_no_store_address(
    serve_asgi: Callable[..., Any], sim: Sim, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    s = settings([sim.url], quotas={
        "enabled": True, "backend": "redis",
        "redis_url": f"redis://:s3cretpw@127.0.0.1:{port}/0", "redis_timeout_s": 0.3,
        "defaults": {"key": {"requests_per_minute": 100, "tokens_per_day": 10_000}}})
    gw = serve_asgi(create_app(s, assemble(s)))
    caplog.set_level(logging.WARNING)
    usage = httpx.get(gw.url + "/v1/usage", headers={"authorization": f"Bearer {KEY_A}"},
                      timeout=10)
    with openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY_A, max_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as relay:
            client.chat.completions.create(model="default", max_tokens=1,
                                           messages=[{"role": "user", "content": "x"}])
    assert usage.status_code == 503 and relay.value.status_code == 503
    for body in (usage.text, relay.value.response.text):
        assert "quota_backend_unavailable" in body
        assert str(port) not in body and "127.0.0.1" not in body and "s3cretpw" not in body
    assert usage.json()["error"]["message"] == relay.value.body["message"]  # type: ignore[index]
    assert str(port) in caplog.text  # the operator still learns which store failed
