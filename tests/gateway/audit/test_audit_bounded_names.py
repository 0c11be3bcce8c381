"""Audit records keep a configured model name as sent and bound an unknown one.

Before, a 200 KB ``model`` made a 200,891-byte ``request.denied`` record: any key holder could
grow the audit store (kept for years, replicated, signed) by 200 KB a request. Now an unknown
name is recorded as :func:`gateway.bounded.bounded` (escaped 64-character prefix, length,
SHA-256 prefix: equal names stay joinable), and so is the path. Real gateway and simulator on
loopback, the official openai SDK, the SQLite store read back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.app import create_app
from gateway.audit import AuditSettings, Signer
from gateway.audit.observer import build
from gateway.bounded import PREFIX_CHARS
from tests.gateway.audit.test_audit_gateway import audit_section, records_of
from tests.gateway.helpers import KEY_A, Sim, settings


def test_unknown_model_name_is_bounded_known_alias_kept(
    serve_asgi: Callable[..., Any], sim: Sim, tmp_path: Path
) -> None:
    store = f"sqlite://{tmp_path / 'audit.db'}"
    observer = build(AuditSettings.model_validate(
        audit_section(tmp_path, store, Signer.generate(), store_timeout_s=0.3)))
    assert observer is not None
    srv = serve_asgi(create_app(settings([sim.url]), observers=[observer]))
    huge = "\x1b[2J" + "m" * 200_000
    with openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY_A, max_retries=0,
                       timeout=20) as client:
        with pytest.raises(openai.NotFoundError) as unknown:
            client.chat.completions.create(model=huge, max_tokens=1,
                                           messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.NotFoundError) as path:
            client.models.retrieve("p" * 4000)
        known = client.chat.completions.with_raw_response.create(
            model="default", max_tokens=1, messages=[{"role": "user", "content": "x"}])
    srv.stop()

    [denied] = records_of(store, unknown.value.response.headers["x-request-id"])
    data = denied.decoded()["data"]
    assert denied.type == "request.denied" and data["error_code"] == "model_not_found"
    assert len(json.dumps(data)) < 2_000
    model = data["model"]
    assert model.startswith("\\x1b[2J" + "m" * (PREFIX_CHARS - 4) + "…[len=200004 sha256=")
    assert model.endswith(hashlib.sha256(huge.encode()).hexdigest()[:16] + "]")

    [denied] = records_of(store, path.value.response.headers["x-request-id"])
    data = denied.decoded()["data"]
    assert len(data["path"]) < 200 and len(data["model"]) < 200
    assert data["path"].startswith("/v1/models/ppp") and "len=4011" in data["path"]

    started = records_of(store, known.headers["x-request-id"])[0].decoded()["data"]
    assert (started["model"], started["canonical_model"]) == ("default", "llama-3.1-8b")
