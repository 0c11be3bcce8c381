"""The egress policy wired into the gateway, in process with the official openai SDK.

Three simulators are the replicas ``us`` (non-EU), ``eu-b`` (EU) and ``eu-a`` (EU, tagged
``no-retention``). The guard is off here (it is process-wide; ``test_gw_egress_serve`` runs it
in a real ``gateway serve``); routing, classification, the policy-checked transport and the
audit records are all real.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse
from starlette.routing import Route

from gateway.app import create_app
from gateway.assembly import assemble
from gateway.audit import Signer, generate_key_file, write_key_pair
from gateway.config.loader import parse
from gateway.egress import start_egress
from gateway.errors import ConfigError
from policy import Policy
from tests.gateway.egress_testdata import KEYS, REGIONS, gateway_config, policy_text
from tests.gateway.helpers import audit_export
from vllm_sim import SimConfig
from vllm_sim import create_app as create_sim

ROOT = Path(__file__).parents[2]
CHAT = [{"role": "user", "content": "hi"}]


class Stack:
    def __init__(self, url: str, sims: dict[str, Any], policy_file: Path, cfg: dict[str, Any]):
        self.url = url
        self.sims = sims
        self.policy_file = policy_file
        self.cfg = cfg

    def client(self, who: str, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=KEYS[who], max_retries=0,
                             timeout=20, default_headers=headers or None)

    def received(self) -> dict[str, int]:
        return {name: app.state.received for name, app in self.sims.items()}


def _build(serve_asgi: Callable[..., Any], tmp_path: Path, *, audit: bool = False,
           unsafe: bool = False) -> Stack:
    sims = {name: create_sim(SimConfig(models=["m"])) for name in ("eu-a", "eu-b", "us")}
    servers = {name: serve_asgi(app) for name, app in sims.items()}
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(policy_text({n: s.port for n, s in servers.items()}, unsafe=unsafe))
    cfg = gateway_config({n: s.url for n, s in servers.items()}, Path("policy.yaml"))
    if audit:
        signer = Signer.generate()
        key, _ = write_key_pair(signer, tmp_path / "audit.key")
        cfg["audit"] = {
            "store": f"sqlite://{tmp_path / 'audit.db'}",
            "signing_key_file": str(key),
            "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key")),
            "replica_id": "egress-test",
        }
    settings = parse(cfg)
    runtime = start_egress(settings, tmp_path)  # relative policy.file: next to the config
    assert runtime is not None and runtime.guard is None
    app = create_app(settings, assemble(settings, tmp_path, egress=runtime))
    return Stack(serve_asgi(app).url, sims, pfile, cfg)


@pytest.fixture
def stack(serve_asgi: Callable[..., Any], tmp_path: Path) -> Stack:
    return _build(serve_asgi, tmp_path)


def _ask(client: openai.OpenAI, stream: bool = False) -> str:
    if stream:
        chunks = client.chat.completions.create(model="m", messages=CHAT, max_tokens=4,
                                                stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    resp = client.chat.completions.create(model="m", messages=CHAT, max_tokens=4)
    return resp.choices[0].message.content or ""


def test_confidential_key_goes_only_to_eu_no_retention(stack: Stack) -> None:
    client = stack.client("conf")
    for i in range(6):
        assert _ask(client, stream=bool(i % 2))
    assert stack.received() == {"eu-a": 6, "eu-b": 0, "us": 0}


def test_public_key_uses_every_replica(stack: Stack) -> None:
    client = stack.client("pub")
    for _ in range(6):
        assert _ask(client)
    assert all(stack.received().values())


def test_deny_rule_gives_403_with_the_rule_id(stack: Stack) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        _ask(stack.client("contractor"))
    body: Any = info.value.body
    assert info.value.status_code == 403
    assert body["code"] == "egress_denied"
    assert "block-contractor" in body["message"]
    assert sum(stack.received().values()) == 0


def test_no_rule_matched_gives_403_saying_so(stack: Stack) -> None:
    with pytest.raises(openai.PermissionDeniedError) as info:
        _ask(stack.client("internal"))
    body: Any = info.value.body
    assert body["code"] == "egress_denied"
    assert "no rule matched" in body["message"]
    assert sum(stack.received().values()) == 0


def test_class_change_by_header_refused_without_grant(stack: Stack) -> None:
    client = stack.client("pub", **{"x-data-classification": "confidential"})
    with pytest.raises(openai.PermissionDeniedError) as info:
        _ask(client)
    body: Any = info.value.body
    assert body["code"] == "class_change_forbidden"
    assert body["param"] == "x-data-classification"
    assert sum(stack.received().values()) == 0
    # lowering is not granted either
    with pytest.raises(openai.PermissionDeniedError):
        _ask(stack.client("conf", **{"x-data-classification": "public"}))
    with pytest.raises(openai.BadRequestError) as bad:
        _ask(stack.client("pub", **{"x-data-classification": "top-secret"}))
    assert bad.value.body["code"] == "unknown_data_class"  # type: ignore[index]
    assert sum(stack.received().values()) == 0


def test_a_repeated_classification_header_is_refused(stack: Stack) -> None:
    """Two ``x-data-classification`` values: neither is taken (400), nothing is forwarded."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    res = httpx.post(stack.url + "/v1/chat/completions", content=body, timeout=20, headers=[
        ("authorization", f"Bearer {KEYS['research']}"), ("content-type", "application/json"),
        ("x-data-classification", "public"), ("x-data-classification", "confidential")])
    assert res.status_code == 400
    assert res.json()["error"]["param"] == "x-data-classification"
    assert sum(stack.received().values()) == 0


def test_class_raise_by_header_allowed_where_granted(stack: Stack) -> None:
    plain = stack.client("research")
    for _ in range(3):
        assert _ask(plain)  # public: anywhere
    spread = stack.received()
    raised = stack.client("research", **{"x-data-classification": "confidential"})
    for _ in range(4):
        assert _ask(raised)
    after = stack.received()
    assert after["eu-a"] == spread["eu-a"] + 4
    assert (after["eu-b"], after["us"]) == (spread["eu-b"], spread["us"])


def _audit_records(db: Path) -> list[dict[str, Any]]:
    return audit_export(f"sqlite://{db}")


def test_audit_records_carry_the_policy_decision(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    stack = _build(serve_asgi, tmp_path, audit=True)
    assert _ask(stack.client("conf"))
    with pytest.raises(openai.PermissionDeniedError):
        _ask(stack.client("contractor"))
    rev = Policy.from_file(stack.policy_file).revision
    records = _audit_records(tmp_path / "audit.db")
    by_type: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        by_type.setdefault(rec["type"], []).append(rec["data"])
    loaded = by_type["policy.loaded"][0]
    assert loaded["revision"] == rev and loaded["guard"] == "off"
    started = by_type["request.started"][0]
    assert started["key_id"] == "k-conf"
    assert started["decision"] == "allow"
    assert started["policy_rule"] == "confidential-eu-no-retention"
    assert started["policy_revision"] == rev
    assert started["data_class"] == "confidential"
    assert started["destination"] == "eu-a"
    assert started["region"] == REGIONS["eu-a"]
    denied = by_type["request.denied"][0]
    assert denied["key_id"] == "k-contractor"
    assert denied["decision"] == "deny"
    assert denied["policy_rule"] == "block-contractor"
    assert denied["policy_revision"] == rev
    assert denied["error_code"] == "egress_denied"


def test_unsafe_allow_all_warns_on_every_request(
    serve_asgi: Callable[..., Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stack = _build(serve_asgi, tmp_path, unsafe=True)
    caplog.set_level(logging.WARNING, logger="gateway.egress")
    client = stack.client("internal")  # no rule would allow it: unsafe lets it through
    for _ in range(3):
        assert _ask(client)
    warnings = [r for r in caplog.records
                if r.name == "gateway.egress" and "request of key" in r.getMessage()]
    assert len(warnings) == 3


def _redirector(_: Request) -> RedirectResponse:
    return RedirectResponse("http://169.254.169.254/latest/meta-data/", status_code=307)


def test_transport_refuses_an_upstream_redirect(
    serve_asgi: Callable[..., Any], tmp_path: Path
) -> None:
    bad = serve_asgi(Starlette(routes=[
        Route("/v1/chat/completions", _redirector, methods=["POST"]),
    ]))
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(
        "version: 1\ndata_classes: [public]\ndestinations:\n"
        f"  - {{id: r, host: 127.0.0.1, port: {bad.port}, region: x, jurisdiction: EU, "
        "operator: o}\nrules:\n  - {id: all, classes: [public]}\n"
    )
    cfg = gateway_config({"us": bad.url, "eu-a": bad.url, "eu-b": bad.url}, pfile)
    for r in cfg["models"][0]["replicas"]:
        r["destination"] = "r"
    cfg["keys"] = [k for k in cfg["keys"] if k["id"] == "k-pub"]
    settings = parse(cfg)
    runtime = start_egress(settings)
    assert runtime is not None
    url = serve_asgi(create_app(settings, assemble(settings, egress=runtime))).url
    r = httpx.post(url + "/v1/chat/completions", timeout=10,
                   headers={"authorization": f"Bearer {KEYS['pub']}"},
                   json={"model": "m", "messages": CHAT})
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "redirect_refused"


def test_replica_outside_its_destination_is_refused(tmp_path: Path) -> None:
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(policy_text({"eu-a": 9001, "eu-b": 9002, "us": 9003}))
    urls = {"eu-a": "http://127.0.0.1:9001", "eu-b": "http://127.0.0.1:9002",
            "us": "http://127.0.0.1:9999"}  # not the port of destination "us"
    settings = parse(gateway_config(urls, pfile))
    with pytest.raises(ConfigError) as info:
        start_egress(settings)
    assert info.value.message.startswith("models[0].replicas[0].destination: replica "
                                         "http://127.0.0.1:9999: port 9999")
    cfg = gateway_config({**urls, "us": "http://127.0.0.1:9003"}, pfile)
    del cfg["models"][0]["replicas"][1]["destination"]
    cfg["keys"][0]["data_class"] = "secret"
    with pytest.raises(ConfigError) as info:
        start_egress(parse(cfg))
    assert "models[0].replicas[1].destination: required" in info.value.message
    assert "keys[0].data_class: 'secret' is not a data class" in info.value.message


def _check_config(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", "--config", str(path), "--json"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )


def test_check_config_validates_policy_file_and_bindings(tmp_path: Path) -> None:
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(policy_text({"eu-a": 9001, "eu-b": 9002, "us": 9003}))
    urls = {n: f"http://127.0.0.1:{p}" for n, p in (("eu-a", 9001), ("eu-b", 9002),
                                                     ("us", 9003))}
    cfg_file = tmp_path / "gateway.yaml"
    cfg = gateway_config(urls, Path("policy.yaml"))
    cfg_file.write_text(yaml.safe_dump(cfg))
    ok = _check_config(cfg_file)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["policy"]["revision"].startswith("sha256:")

    cfg["models"][0]["replicas"][2]["url"] = "http://127.0.0.2:9001"
    cfg_file.write_text(yaml.safe_dump(cfg))
    bad = _check_config(cfg_file)
    assert bad.returncode == 1
    problems = json.loads(bad.stdout)["problems"]
    assert "models[0].replicas[2].destination" in [p["key"] for p in problems]

    pfile.write_text(pfile.read_text().replace("effect: deny", "effect: maybe"))
    cfg["models"][0]["replicas"][2]["url"] = urls["eu-a"]
    cfg_file.write_text(yaml.safe_dump(cfg))
    broken = _check_config(cfg_file)
    assert broken.returncode == 1
    [problem] = json.loads(broken.stdout)["problems"]
    err = f"{problem['key']}: {problem['problem']}"
    assert err.startswith("policy.file: ") and "policy.yaml:" in err and "effect" in err

    # Every problem of the policy file is its own policy.file problem, not one run-on line.
    pfile.write_text(pfile.read_text().replace("effect: maybe", "effect: maybe, efect: x"))
    both = _check_config(cfg_file)
    assert both.returncode == 1
    problems = json.loads(both.stdout)["problems"]
    assert [p["key"] for p in problems] == ["policy.file", "policy.file"]
    assert "rules[0].effect: " in problems[0]["problem"]
    assert problems[1]["problem"].endswith(": rules[0].efect: unknown key (did you mean "
                                           "'effect'?)")
