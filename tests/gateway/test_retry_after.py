"""A replica's ``Retry-After`` is validated (RFC 9110 section 10.2.3), capped, and relayed as
delay-seconds; an invalid one is dropped. Parser cases, then a real loopback replica (raw ASGI
under uvicorn) behind a real gateway, seen through the official openai SDK."""

from __future__ import annotations

import calendar
import email.utils
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from gateway.relay.retry_after import parse_retry_after, relayed_retry_after
from tests.gateway.helpers import SERVED, Clients, settings, start_gateway

NOW = float(calendar.timegm((2026, 12, 2, 0, 0, 0)))  # Wed, 02 Dec 2026 00:00:00 GMT


def _now() -> float:
    return NOW


@pytest.mark.parametrize(("value", "seconds"), [
    ("0", 0.0),
    ("120", 120.0),
    (" 7 ", 7.0),  # optional whitespace around a field value
    ("99999999999", 99999999999.0),
    ("Wed, 02 Dec 2026 00:01:30 GMT", 90.0),  # IMF-fixdate
    ("Wednesday, 02-Dec-26 00:01:30 GMT", 90.0),  # obsolete RFC 850
    ("Wed Dec  2 00:01:30 2026", 90.0),  # asctime
    ("Tue, 01 Dec 2026 23:59:00 GMT", 0.0),  # in the past: retry now
    ("Wed, 02 Dec 2026 00:00:59 GMT", 59.0),
    ("Wed, 02 Dec 2026 00:00:60 GMT", 60.0),  # a leap second
])
def test_valid_values(value: str, seconds: float) -> None:
    assert parse_retry_after(value, now=_now) == seconds


@pytest.mark.parametrize("value", [
    "", "soon", "-5", "+5", "1.5", "1e3", "inf", "nan", "0x10", "5 s", "١٢",  # Arabic digits
    "Wed, 02 Dec 2026 00:01:30 UTC",  # HTTP-date is GMT only
    "Wed, 2 Dec 2026 00:01:30 GMT",  # IMF-fixdate day is two digits
    "Wed, 31 Feb 2026 00:01:30 GMT",  # no such day
    "Wed, 02 Dec 2026 25:00:00 GMT",
    "Wed, 02 Dec 2026 00:00:61 GMT",
    "2026-12-02T00:01:30Z",  # ISO 8601 is not an HTTP-date
    "wed, 02 dec 2026 00:01:30 gmt",  # names are case-sensitive
])
def test_invalid_values(value: str) -> None:
    assert parse_retry_after(value, now=_now) is None
    assert relayed_retry_after(value, 300.0, now=_now) is None


def test_absent_is_none() -> None:
    assert parse_retry_after(None) is None
    assert relayed_retry_after(None, 300.0) is None


def test_rfc850_two_digit_year_more_than_50_years_ahead_is_in_the_past() -> None:
    # From 2026, "77" is 1977 (2077 is more than 50 years ahead); "76" is 2076.
    assert parse_retry_after("Monday, 01-Jan-77 00:00:00 GMT", now=_now) == 0.0
    in_2076 = float(calendar.timegm((2076, 1, 1, 0, 0, 0))) - NOW
    assert parse_retry_after("Wednesday, 01-Jan-76 00:00:00 GMT", now=_now) == in_2076


@pytest.mark.parametrize(("value", "relayed"), [
    ("120", "120"),
    ("99999999999", "300"),  # capped
    ("Wed, 02 Dec 2026 00:01:30 GMT", "90"),  # a date becomes delay-seconds
    ("Fri, 01 Jan 2100 00:00:00 GMT", "300"),
    ("Tue, 01 Dec 2026 00:00:00 GMT", "0"),
])
def test_relayed_form_is_capped_delay_seconds(value: str, relayed: str) -> None:
    assert relayed_retry_after(value, 300.0, now=_now) == relayed
    assert relayed_retry_after(value, 2.5, now=_now) == str(min(int(relayed), 3))  # rounded up


# --- a real replica behind a real gateway -------------------------------------------------


class Replica:
    """A raw ASGI backend: each chat request pops the next ``(status, retry_after)`` answer
    (``retry_after`` None: no header); an empty script answers 200 with a completion."""

    def __init__(self) -> None:
        self.script: list[tuple[int, str | None]] = []
        self.received = 0

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] != "/v1/chat/completions":
            await self._send(send, 200, {"status": "ok"}, None)
            return
        self.received += 1
        status, retry_after = self.script.pop(0) if self.script else (200, None)
        if status == 200:
            body: dict[str, Any] = {
                "id": "c1", "object": "chat.completion", "created": 1, "model": SERVED,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "hello"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        else:
            body = {"error": {"message": "busy", "type": "x", "code": status}}
        await self._send(send, status, body, retry_after)

    @staticmethod
    async def _send(send: Callable[..., Any], status: int, body: dict[str, Any],
                    retry_after: str | None) -> None:
        raw = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(raw)).encode())]
        if retry_after is not None:
            headers.append((b"retry-after", retry_after.encode("latin-1")))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": raw})


MESSAGES: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture
def replica(serve_asgi: Callable[..., Any]) -> tuple[Replica, str]:
    backend = Replica()
    return backend, str(serve_asgi(backend).url)


@pytest.mark.parametrize(("sent", "relayed"), [
    ("99999999999", "300"),
    ("Fri, 01 Jan 2100 00:00:00 GMT", "300"),
    ("45", "45"),
    ("soon", None),
    ("-5", None),
    ("inf", None),
    ("1.5", None),
])
@pytest.mark.parametrize("status", [429, 500])
def test_client_sees_a_valid_capped_retry_after_or_none(
    serve_asgi: Callable[..., Any], replica: tuple[Replica, str], clients: Clients,
    status: int, sent: str, relayed: str | None,
) -> None:
    backend, url = replica
    backend.script = [(status, sent)]
    gw = start_gateway(serve_asgi, settings([url]))
    with pytest.raises(openai.APIStatusError) as info:
        clients(gw).chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)
    assert info.value.status_code == status
    assert info.value.response.headers.get("retry-after") == relayed


def test_cool_down_of_a_replica_is_capped(
    serve_asgi: Callable[..., Any], replica: tuple[Replica, str], clients: Clients,
) -> None:
    """A replica that asks for 3,000 years is back after ``retries.retry_after_cap_s``."""
    backend, url = replica
    backend.script = [(429, "99999999999")]
    gw = start_gateway(serve_asgi, settings([url], retries={"retry_after_cap_s": 1,
                                                            "max_retry_after_s": 0}))
    with pytest.raises(openai.RateLimitError) as info:
        clients(gw).chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)
    assert info.value.response.headers["retry-after"] == "1"
    assert httpx.get(gw + "/readyz").status_code == 503  # ejected for its (capped) Retry-After
    deadline = time.monotonic() + 10
    while httpx.get(gw + "/readyz").status_code != 200:
        assert time.monotonic() < deadline, "the replica stayed out past the cap"
        time.sleep(0.05)
    r = clients(gw).chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)
    assert r.choices[0].message.content == "hello"


def test_a_short_http_date_is_waited_out_like_delay_seconds(
    serve_asgi: Callable[..., Any], replica: tuple[Replica, str], clients: Clients,
) -> None:
    """One replica, 429 with an HTTP-date about a second ahead (under
    ``retries.max_retry_after_s``): the gateway waits and retries, the client sees 200."""
    backend, url = replica
    soon = email.utils.formatdate(time.time() + 2, usegmt=True)  # IMF-fixdate
    backend.script = [(429, soon)]
    gw = start_gateway(serve_asgi, settings([url], retries={"max_retry_after_s": 3}))
    r = clients(gw).chat.completions.create(model="llama-3.1-8b", messages=MESSAGES)
    assert r.choices[0].message.content == "hello"
    assert backend.received == 2
