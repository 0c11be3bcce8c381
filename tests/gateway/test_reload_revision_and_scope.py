"""What a live reload may change, the revision it records, and what the new router keeps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.assembly import Gateway, reassemble
from gateway.config.loader import load
from gateway.config.settings import GatewaySettings
from gateway.errors import ConfigError
from gateway.routing import Router
from gateway.serving.reload import restart_only_changes, revision_of
from tests.gateway.helpers import config, sha

ENV = {"VLLM_KEY": "backend-key"}


def _load(tmp_path: Path, cfg: dict[str, Any], name: str = "gw.yaml") -> GatewaySettings:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg))
    return load(path, ENV)


def _cfg(**overrides: Any) -> dict[str, Any]:
    return config(["http://127.0.0.1:9001", "http://127.0.0.1:9002"], **overrides)


def test_keys_models_limits_and_timeouts_change_live_the_rest_is_named(tmp_path: Path) -> None:
    old = _load(tmp_path, _cfg())
    live = _cfg(limits={"max_body_bytes": 1024, "forward_headers": ["x-b3-traceid"]},
                timeouts={"connect_s": 3, "first_byte_s": 9, "idle_s": 9},
                retries={"max_attempts": 1}, health={"active": False, "cooldown_s": 1})
    live["keys"] = [{"id": "new", "sha256": sha("new-key"), "models": ["*"]}]
    live["models"][0]["replicas"].append({"url": "http://127.0.0.1:9003"})
    assert restart_only_changes(old, _load(tmp_path, live, "live.yaml")) == []

    fixed = _cfg(listen={"port": 8443}, limits={"max_client_connections": 9},
                 logging={"level": "debug"}, health={"active": True, "cooldown_s": 30},
                 drain={"timeout_s": 60})
    changes = restart_only_changes(old, _load(tmp_path, fixed, "fixed.yaml"))
    assert changes == [("listen", "port"), ("limits", "max_client_connections"),
                       ("health", "active"), ("logging", "level"), ("drain", "timeout_s")]


def test_revision_is_stable_and_covers_the_keys_file_and_credentials(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump([{"id": "k1", "sha256": sha("one"), "models": ["*"]}]))
    cfg = _cfg()
    cfg["keys_file"] = "keys.yaml"
    first = revision_of(_load(tmp_path, cfg))
    assert first == revision_of(_load(tmp_path, cfg, "again.yaml"))  # same content, same hash
    assert first.startswith("sha256:") and len(first) == 7 + 64

    keys.write_text(yaml.safe_dump([{"id": "k1", "sha256": sha("two"), "models": ["*"]}]))
    rotated_key = revision_of(_load(tmp_path, cfg))
    assert rotated_key != first

    rotated_credential = load(tmp_path / "gw.yaml", {"VLLM_KEY": "another-backend-key"})
    assert revision_of(rotated_credential) != rotated_key
    assert "backend-key" not in rotated_credential.model_dump_json()


def test_new_router_keeps_unchanged_pools_and_the_health_of_kept_replicas(tmp_path: Path) -> None:
    old_settings = _load(tmp_path, _cfg())
    running = Gateway.of(old_settings)
    pool = running.router.pools["llama-3.1-8b"]
    pool.replicas[1].probe_ok = False  # failing its health check
    pool.replicas[0].outstanding = 3  # in flight
    other = running.router.pools["other-model"]

    cfg = _cfg()
    cfg["models"][0]["replicas"].append({"url": "http://127.0.0.1:9003"})
    new = reassemble(running, _load(tmp_path, cfg, "new.yaml"), tmp_path)
    assert new.router is not running.router
    assert new.router.pools["other-model"] is other  # unchanged model: same pool object
    changed = new.router.pools["llama-3.1-8b"]
    assert changed is not pool and [r.url for r in changed.replicas] == [
        "http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"]
    assert [r.probe_ok for r in changed.replicas] == [True, False, True]
    assert pool.replicas[0].outstanding == 3  # the running requests' replica is untouched
    assert running.router.pools["llama-3.1-8b"] is pool  # the running gateway is unchanged
    assert Router(old_settings, reuse=new.router).pools["other-model"] is other


def test_the_first_litellm_replica_needs_a_restart(tmp_path: Path) -> None:
    running = Gateway.of(_load(tmp_path, _cfg()))
    cfg = _cfg()
    cfg["models"][1]["replicas"].append({"url": "http://127.0.0.1:9004", "kind": "litellm",
                                         "litellm_model": "hosted_vllm/x"})
    with pytest.raises(ConfigError) as refused:
        reassemble(running, _load(tmp_path, cfg, "new.yaml"), tmp_path)
    assert refused.value.code == "restart_required"
    assert refused.value.message.startswith("models[1].replicas[1].kind: litellm is imported")


def test_quota_limits_change_live_the_quota_backend_does_not(tmp_path: Path) -> None:
    old = _load(tmp_path, _cfg(quotas={"keys": {"team-a": {"requests_per_minute": 10}}}))
    limits = _cfg(quotas={"keys": {"team-a": {"requests_per_minute": 1}},
                          "teams": {"a": {"tokens_per_minute": 100}},
                          "defaults": {"key": {"max_concurrent": 2}}})
    assert restart_only_changes(old, _load(tmp_path, limits, "limits.yaml")) == []
    backend = _cfg(quotas={"keys": {"team-a": {"requests_per_minute": 10}}, "backend": "redis"})
    assert restart_only_changes(old, _load(tmp_path, backend, "backend.yaml")) == [
        ("quotas", "backend")]
