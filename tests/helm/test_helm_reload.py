"""``gateway.reload.mode``: rollout (checksum annotations roll the pods) or live (the gateway
watches its mounted ConfigMap and Secrets and reloads them in place). Real helm renders; the live
pod is served by the real gateway and its ConfigMap updated as the kubelet does."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sg_helm as h
import sg_pod_files as pf
import yaml

from tests.conftest import free_port

LIVE = {"gateway.reload.mode": "live", "gateway.reload.interval_s": "1"}


def _pod_template(objs: list[dict[str, Any]]) -> dict[str, Any]:
    template: dict[str, Any] = h.one(objs, "Deployment", pf.DEPLOYMENT)["spec"]["template"]
    return template


def test_rollout_mode_rolls_the_pods_on_a_config_change() -> None:
    objs = h.render(h.SCENARIOS["default"])
    annotations = _pod_template(objs)["metadata"]["annotations"]
    assert {"checksum/config", "checksum/egress"} <= set(annotations)
    config = yaml.safe_load(h.one(objs, "ConfigMap", pf.CONFIG_MAP)["data"]["config.yaml"])
    assert "reload" not in config  # no file watch
    assert pf.config_path(objs) == pf.CONFIG_PATH


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_live_mode_mounts_the_config_directory_and_has_no_checksums(
    scenario: str, tmp_path: Path,
) -> None:
    objs = h.render(h.SCENARIOS[scenario], sets=LIVE)
    template = _pod_template(objs)
    assert not [a for a in template["metadata"].get("annotations", {})
                if a.startswith("checksum/")]
    mounts = {m["mountPath"]: m for m in pf.gateway_container(objs)["volumeMounts"]}
    # a subPath mount is never updated by the kubelet: the config volume is mounted whole
    assert mounts["/etc/sovereign-gateway/config"] == {
        "name": "config", "mountPath": "/etc/sovereign-gateway/config", "readOnly": True}
    assert not [m for m in mounts.values() if m.get("subPath") in ("config.yaml", "policy.yaml")]
    assert pf.config_path(objs) == "/etc/sovereign-gateway/config/config.yaml"
    config = yaml.safe_load(h.one(objs, "ConfigMap", pf.CONFIG_MAP)["data"]["config.yaml"])
    assert config["reload"] == {"watch": True, "interval_s": 1}
    assert config["policy"]["file"] == "/etc/sovereign-gateway/config/policy.yaml"
    pod = pf.materialize(objs, tmp_path)
    code, out = pf.check_config(pod.config_file)
    assert code == 0, out
    assert out["policy"]["file"] == str(tmp_path / "etc/sovereign-gateway/config/policy.yaml")


def test_live_mode_refuses_an_unknown_mode() -> None:
    err = h.refuse(h.SCENARIOS["default"], sets={"gateway.reload.mode": "hot"})
    assert "/gateway/reload/mode" in err


def _serve_config(pod_config: dict[str, Any], api: int, admin: int) -> str:
    config = dict(pod_config)
    config["listen"] = {**config["listen"], "host": "127.0.0.1", "port": api}
    config["telemetry"] = {**config["telemetry"], "admin": {"host": "127.0.0.1", "port": admin}}
    # The chart's drain.delay_s (5 s) is for the Service endpoints; none here: stop at once.
    config["drain"] = {**config["drain"], "delay_s": 0}
    return yaml.safe_dump(config, sort_keys=False)


def _wait(cond: Any, timeout_s: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}: {log.read_text(encoding='utf-8')}")
        time.sleep(0.1)


def _models(api: int) -> list[str] | None:
    try:
        resp = httpx.get(f"http://127.0.0.1:{api}/v1/models", timeout=2,
                         headers={"Authorization": f"Bearer {pf.API_KEY}"})
    except httpx.TransportError:
        return None
    return [m["id"] for m in resp.json()["data"]] if resp.status_code == 200 else None


def test_live_pod_reloads_an_updated_config_map_without_a_restart(tmp_path: Path) -> None:
    """helm upgrade with a new model: the kubelet swaps the mounted ConfigMap; the running
    gateway (same process) serves the new model; a listen port change is refused."""
    objs = h.render(h.SCENARIOS["default"], sets=LIVE)
    pod = pf.materialize(objs, tmp_path)
    api, admin = free_port(), free_port()
    config_dir = pod.config_file.parent
    cm = h.one(objs, "ConfigMap", pf.CONFIG_MAP)["data"]
    pf.update_config_map(config_dir, {**cm, "config.yaml": _serve_config(pod.config, api, admin)},
                         "v2")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    log_path = tmp_path / "serve.log"
    log = log_path.open("w", encoding="utf-8")
    proc = subprocess.Popen([str(pf.GATEWAY_CLI), "serve", "--config", str(pod.config_file)],
                            stdout=subprocess.DEVNULL, stderr=log, text=True, env=env)
    try:
        _wait(lambda: _models(api) is not None or proc.poll() is not None, 60, "start", log_path)
        assert _models(api) == ["llama-3.1-8b"]

        # helm upgrade: one more model (same destination); the same relocation of the paths
        extra = tmp_path / "more.yaml"
        values = yaml.safe_load(h.SCENARIOS["default"].read_text(encoding="utf-8"))
        models = [*values["gateway"]["models"], {
            "name": "second", "served_model_name": "org/second", "replicas": [{
                "url": "http://10.20.0.11:8000", "destination": "vllm-external"}]}]
        extra.write_text(yaml.safe_dump({"gateway": {"models": models}}), encoding="utf-8")
        upgraded = pf.materialize(h.render(h.SCENARIOS["default"], extra, sets=LIVE),
                                  tmp_path / "upgrade")
        new_cm = {**h.one(upgraded.objects, "ConfigMap", pf.CONFIG_MAP)["data"]}
        new_config = yaml.safe_load(_serve_config(upgraded.config, api, admin).replace(
            str(tmp_path / "upgrade"), str(tmp_path)))
        pf.update_config_map(config_dir, {**new_cm, "config.yaml": yaml.safe_dump(
            new_config, sort_keys=False)}, "v3")
        _wait(lambda: _models(api) == ["llama-3.1-8b", "second"], 30, "the reload", log_path)
        assert proc.poll() is None  # the same process: no restart

        # a change that needs a restart is refused, naming the key; the pod keeps serving
        new_config["listen"]["port"] = free_port()
        pf.update_config_map(config_dir, {**new_cm, "config.yaml": yaml.safe_dump(
            new_config, sort_keys=False)}, "v4")
        _wait(lambda: "listen.port: cannot change while serving" in log_path.read_text(
            encoding="utf-8"), 30, "the refusal", log_path)
        assert _models(api) == ["llama-3.1-8b", "second"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
