"""An identity rule's flow_class sets the caller's flow-control priority class (as
flow_control.keys/teams do for keys), through a real uvicorn with the openai SDK; an unknown
class name is refused at load, naming the rule."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.app import create_app
from gateway.assembly import Gateway
from gateway.audit import generate_key_file
from gateway.auth import KeyRing
from gateway.errors import ConfigError
from gateway.identity.build import wrap_identity
from tests.gateway.helpers import Recorder, Sim
from tests.gateway.identity.jwtkit import SigningKey, identity_section, write_jwks
from tests.gateway.test_flow_control import KEYS, flow_settings


def _section(tmp: Path, key: SigningKey, flow_class: str) -> dict[str, Any]:
    jwks = tmp / "jwks.json"
    section = identity_section(jwks, write_jwks(jwks, key))
    pseudo = tmp / "pseudonym.key"
    section["pseudonym_key_file"] = str(pseudo if pseudo.exists() else generate_key_file(pseudo))
    section["rules"] = [
        {"id": "night-batch", "match": {"groups": "batch-jobs"}, "models": ["*"],
         "flow_class": flow_class},
        {"id": "people", "match": {"groups": "ml-engineers"}, "models": ["*"]},
    ]
    return section


def test_a_rule_assigns_the_flow_class(serve_asgi: Callable[..., Any], sim: Sim,
                                       tmp_path: Path) -> None:
    key = SigningKey("k1")
    s = flow_settings(sim.url, _extra={"identity": _section(tmp_path, key, "batch")})
    recorder = Recorder()
    gateway = Gateway.of(s, authenticator=wrap_identity(s, KeyRing(s.keys)),
                         observers=[recorder])
    url = str(serve_asgi(create_app(s, gateway)).url)
    for credential in (key.token(groups=["batch-jobs"]), key.token(groups=["ml-engineers"]),
                       KEYS["interactive"]):
        with openai.OpenAI(base_url=url + "/v1", api_key=credential, max_retries=0) as client:
            client.chat.completions.create(model="m", max_tokens=2,
                                           messages=[{"role": "user", "content": "x"}])
    classes = [r.flow["class"] for r in recorder.wait(3) if r.flow is not None]
    assert classes == ["batch", "standard", "interactive"]  # rule, default, the key's


def test_an_unknown_flow_class_is_refused(sim: Sim, tmp_path: Path) -> None:
    s = flow_settings(sim.url, _extra={"identity": _section(tmp_path, SigningKey("k"), "gold")})
    with pytest.raises(ConfigError, match=r"identity\.rules\[0\]\.flow_class: 'gold'"):
        wrap_identity(s, KeyRing(s.keys))
