"""The aiohttp and httpx transports make the same egress decision (one shared check).

Both are driven, case by case, against the same real uvicorn server on loopback with the same
scripted DNS answers; the outcome (allowed and answered, or refused with the reason) and the
names each asked DNS for must be identical, and as expected. ``unsafe_allow_all`` is in the
table: it was honoured by the aiohttp transport only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from test_policy_transport import ScriptedResolver, recording_app

from policy import EgressDenied, Policy, make_httpx_client, make_session

Outcome = tuple[str, str]


def _policy(port: int, *, unsafe: bool) -> Policy:
    dest = "region: lo, jurisdiction: EU, operator: me"
    return Policy.from_text(
        "version: 1\ndata_classes: [public]\ndestinations:\n"
        f"  - {{id: ip, url: 'http://127.0.0.1:{port}', {dest}}}\n"
        f"  - {{id: model, url: 'http://model.internal:{port}', {dest},"
        " resolves_to: [127.0.0.0/8]}\n"
        f"  - {{id: public, host: public.example, port: {port}, {dest}}}\n"
        + ("unsafe_allow_all: true\n" if unsafe else "")
    )


#: (case, unsafe_allow_all, URL host, DNS answer, expected outcome, names asked of DNS)
CASES: list[tuple[str, bool, str, list[str] | None, Outcome, list[str]]] = [
    ("address destination", False, "127.0.0.1", None, ("allow", "200"), []),
    ("address no destination allows", False, "127.0.0.2", None,
     ("deny", "no destination allows 127.0.0.2:{port}"), []),
    ("cloud metadata literal", False, "169.254.169.254", None,
     ("deny", "169.254.169.254 is always denied (link-local / cloud metadata)"), []),
    ("named hostname", False, "Model.Internal.", ["127.0.0.1"], ("allow", "200"),
     ["model.internal"]),
    ("unnamed hostname: no query", False, "other.example", ["127.0.0.1"],
     ("deny", "no destination names other.example:{port}"), []),
    ("named, resolves outside resolves_to", False, "model.internal", ["10.9.9.9"],
     ("deny", "resolved to 10.9.9.9, outside resolves_to of destination model"),
     ["model.internal"]),
    ("named, resolves to loopback without resolves_to", False, "public.example", ["127.0.0.1"],
     ("deny", "resolved to 127.0.0.1 (loopback (add resolves_to to allow it)) for destination "
              "public"), ["public.example"]),
    ("unsafe: unnamed hostname", True, "other.example", ["127.0.0.1"], ("allow", "200"),
     ["other.example"]),
    ("unsafe: cloud metadata literal", True, "169.254.169.254", None,
     ("deny", "169.254.169.254 is always denied (link-local / cloud metadata)"), []),
    ("unsafe: unnamed hostname resolving to metadata", True, "meta.example",
     ["169.254.169.254"],
     ("deny", "169.254.169.254 is always denied (link-local / cloud metadata)"),
     ["meta.example"]),
    ("unsafe: named hostname still pinned and checked", True, "model.internal", ["10.9.9.9"],
     ("deny", "resolved to 10.9.9.9, outside resolves_to of destination model"),
     ["model.internal"]),
]


async def _aiohttp(policy: Policy, url: str, host: str, answer: list[str] | None) -> tuple[
        Outcome, list[str]]:
    resolver = ScriptedResolver({host.lower().rstrip("."): [answer or []]})
    try:
        async with make_session(policy, resolver=resolver) as s, s.get(url) as resp:
            outcome = ("allow", str(resp.status))
    except EgressDenied as exc:
        outcome = ("deny", exc.reason)
    return outcome, resolver.calls


async def _httpx(policy: Policy, url: str, answer: list[str] | None) -> tuple[
        Outcome, list[str]]:
    calls: list[str] = []

    def resolve(name: str, port: int) -> list[str]:
        calls.append(name)
        return list(answer or [])

    try:
        async with make_httpx_client(policy, resolver=resolve) as client:
            resp = await client.get(url)
            outcome = ("allow", str(resp.status_code))
    except EgressDenied as exc:
        outcome = ("deny", exc.reason)
    return outcome, calls


@pytest.mark.parametrize(("case", "unsafe", "host", "answer", "expected", "asked"), CASES,
                         ids=[c[0] for c in CASES])
def test_both_transports_decide_alike(
    serve_asgi: Callable[..., Any], case: str, unsafe: bool, host: str,
    answer: list[str] | None, expected: Outcome, asked: list[str],
) -> None:
    srv = serve_asgi(recording_app([]))
    url = f"http://{host}:{srv.port}/x"
    want = (expected[0], expected[1].format(port=srv.port))
    # A fresh policy (and so a fresh pin store) per transport: neither sees the other's pins.
    via_aiohttp = asyncio.run(_aiohttp(_policy(srv.port, unsafe=unsafe), url, host, answer))
    via_httpx = asyncio.run(_httpx(_policy(srv.port, unsafe=unsafe), url, answer))
    assert via_aiohttp == via_httpx, case
    assert via_aiohttp == (want, asked), case
