"""The config.yaml the chart renders loads in the real gateway settings loader, in-process.

Files the config names under /etc/sovereign-gateway (mounted Secrets in the pod) are recreated
under a temporary folder so the loader can read them. Every key the chart renders (``admin``
under ``telemetry``, ``keys_file``, ``audit.store_file``) is accepted by the gateway: the full
config must load, with no key left out. test_helm_check_config.py runs the real
``gateway check-config`` CLI on the same renders (policy, telemetry and audit key checks too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sg_helm as h
import yaml

from gateway.audit import AuditSettings
from gateway.config.loader import parse

#: Keys of the audit: section the gateway's settings resolve before AuditSettings sees them.
RESOLVED_AUDIT = ("store_file",)
ETC = "/etc/sovereign-gateway/"
KEYS_FILE = ETC + "keys/keys.yaml"
# What the chart's README tells operators to put in the keys Secret (64 hex: a sha256 digest).
KEYS_YAML = f"[{{id: team-a, sha256: {'ab' * 32}, models: ['*'], team: a, data_class: internal}}]\n"


def _rendered_config(scenario: str) -> dict[str, Any]:
    objs = h.render(h.SCENARIOS[scenario])
    cm = h.one(objs, "ConfigMap", "sg-sovereign-gateway-config")
    data: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return data


def _relocate(node: Any, root: Path) -> Any:
    """Point /etc/sovereign-gateway/... paths into ``root`` and create those files."""
    if isinstance(node, dict):
        return {k: _relocate(v, root) for k, v in node.items()}
    if isinstance(node, list):
        return [_relocate(v, root) for v in node]
    if isinstance(node, str) and node.startswith(ETC):
        path = root / node.removeprefix(ETC)
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            content = KEYS_YAML if node == KEYS_FILE else "placeholder-secret\n"
            path.write_text(content, encoding="utf-8")
        return str(path)
    return node


@pytest.mark.parametrize("scenario", sorted(h.SCENARIOS))
def test_rendered_config_loads_in_the_gateway(scenario: str, tmp_path: Path) -> None:
    cfg = _relocate(_rendered_config(scenario), tmp_path)
    settings = parse(cfg)
    audit = cfg["audit"]
    assert settings.listen.host == "0.0.0.0"  # noqa: S104 - the pod's listener
    assert settings.listen.port == 8080
    assert settings.models, "the chart renders at least one model"
    if "keys_file" in cfg:
        assert [(k.id, k.models) for k in settings.keys] == [("team-a", ["*"])]
    audit_settings = AuditSettings(**{k: v for k, v in audit.items() if k not in RESOLVED_AUDIT})
    if "store_file" in cfg["audit"]:
        assert Path(cfg["audit"]["store_file"]).is_file()
    else:
        assert audit_settings.store == "sqlite:///var/lib/sovereign-gateway/audit/audit.db"
    assert audit_settings.signing_key_file.is_file()
    assert audit_settings.pseudonym_key_file.is_file()


def test_vllm_backends_are_wired_into_the_gateway_models(tmp_path: Path) -> None:
    cfg = _relocate(_rendered_config("vllm"), tmp_path)
    settings = parse(cfg)
    urls = {m.name: [str(r.url) for r in m.replicas] for m in settings.models}
    assert urls == {
        "llama-3-1-8b": ["http://sg-sovereign-gateway-vllm-llama-3-1-8b:8000"],
        "llama-3-3-70b": ["http://sg-sovereign-gateway-vllm-llama-3-3-70b:8000"],
    }
    services = {s["metadata"]["name"] for s in h.by_kind(h.render(h.SCENARIOS["vllm"]),
                                                        "Service")}
    assert {"sg-sovereign-gateway-vllm-llama-3-1-8b",
            "sg-sovereign-gateway-vllm-llama-3-3-70b"} <= services
