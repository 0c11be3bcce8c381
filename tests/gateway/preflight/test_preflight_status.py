"""The admin server's ``GET /status`` (additive to ``/metrics``) and the kubeconfig boundary."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from gateway.cli import main
from gateway.preflight import PreflightInputError
from gateway.preflight.kube import load_kubeconfig
from gateway.preflight.status import audit_state
from gateway.telemetry.admin import AdminServer
from tests.gateway.preflight.conftest import FakeKube, write_kubeconfig


def test_status_is_404_without_a_source_and_reports_the_loop_with_one() -> None:
    async def run() -> tuple[int, int, dict[str, Any], int]:
        admin = AdminServer("127.0.0.1", 0, CollectorRegistry())
        await admin.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{admin.port}",
                                         trust_env=False) as c:
                before = (await c.get("/status")).status_code

                async def source() -> dict[str, Any]:
                    return {"schema": "x", "guard": {"mode": "enforce"}}

                admin.set_status(source)
                resp = await c.get("/status")
                metrics = (await c.get("/metrics")).status_code
                return before, resp.status_code, resp.json(), metrics
        finally:
            await admin.stop()

    before, code, body, metrics = asyncio.run(run())
    assert (before, code, metrics) == (404, 200, 200)
    assert body["guard"] == {"mode": "enforce"}
    assert body["loop"].startswith("asyncio.")


def test_audit_state_of_an_unreadable_store_is_reported_not_raised(tmp_path: Path) -> None:
    state = asyncio.run(audit_state({"store": f"sqlite://{tmp_path / 'missing.db'}",
                                     "signing_key_file": str(tmp_path / "k"),
                                     "pseudonym_key_file": str(tmp_path / "p")}))
    assert state["state"] == "unavailable" and state["last_checkpoint"] is None
    assert asyncio.run(audit_state(None)) == {"enabled": False}


def test_wrong_token_exits_2_naming_the_api_path(fake_kube: FakeKube, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_kubeconfig(tmp_path / "kubeconfig", fake_kube.url, token="wrong")  # noqa: S106
    code = main(["preflight", "--kubeconfig", str(cfg), "-n", "sovereign-ai"])
    assert code == 2
    err = capsys.readouterr().err
    assert "kubernetes API /api/v1/namespaces/sovereign-ai/pods: HTTP 401" in err
    assert "wrong" not in err  # the token is never printed


def test_exec_plugin_kubeconfig_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(
        "current-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {exec: {command: aws, args: [eks, get-token]}}}]\n")
    with pytest.raises(PreflightInputError, match="runs no plugins"):
        load_kubeconfig(cfg)
