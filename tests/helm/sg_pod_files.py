"""Recreate the gateway pod's files from a chart render, so the real gateway can load them.

The chart's gateway container reads config.yaml, policy.yaml (ConfigMap subPath mounts, or with
``gateway.reload.mode: live`` the whole ConfigMap mounted as a directory, laid out as the kubelet
does: ``..data`` a symlink to a versioned directory, each key a symlink through it) and
mounted Secrets and volumes under /etc/sovereign-gateway and /var/lib/sovereign-gateway. This
module lays those mounts out under a temporary root, with faithful stand-ins for the Secrets an
operator creates (a real Ed25519 audit key from ``gateway audit keygen``, a pseudonym key, a
keys list with a real SHA-256 digest, backend key files), and rewrites every path in the
rendered config that lies under a mount to the same path under the root. A path the config names
outside every mount is left as it is, so the gateway fails on it as it would in the pod.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sg_helm as h
import yaml

GATEWAY_CLI = h.REPO / ".venv" / "bin" / "gateway"
DEPLOYMENT = "sg-sovereign-gateway"
CONFIG_MAP = "sg-sovereign-gateway-config"
CONFIG_PATH = "/etc/sovereign-gateway/config.yaml"
"""Where config.yaml is with ``gateway.reload.mode: rollout`` (the default)."""
#: The plaintext API key the stand-in keys Secret holds the digest of.
API_KEY = "sk-helm-chart-test-key-0123456789"
KEYS_YAML = yaml.safe_dump([{
    "id": "team-a", "sha256": hashlib.sha256(API_KEY.encode()).hexdigest(), "models": ["*"],
    "team": "a", "data_class": "internal"}])
#: Stand-in URL of the PostgreSQL audit store Secret (check-config does not open the store).
AUDIT_DB_URL = "postgresql://postgres@127.0.0.1:5432/sg_audit\n"
BACKEND_KEY = "sk-backend-stand-in\n"


@dataclass(frozen=True)
class PodFiles:
    """A gateway pod's file system recreated under ``root``."""

    root: Path
    config_file: Path
    config: dict[str, Any]
    mounts: dict[str, dict[str, Any]]  # mountPath -> the pod volume it mounts
    objects: list[dict[str, Any]]


def gateway_container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``gateway`` container of the chart's Deployment."""
    pod = h.one(objs, "Deployment", DEPLOYMENT)["spec"]["template"]["spec"]
    found: list[dict[str, Any]] = [c for c in pod["containers"] if c["name"] == "gateway"]
    assert len(found) == 1, "the Deployment has one gateway container"
    return found[0]


def _mounts(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    pod = h.one(objs, "Deployment", DEPLOYMENT)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: {**volumes[m["name"]], "subPath": m.get("subPath")}
            for m in gateway_container(objs)["volumeMounts"]}


def _relocate(node: Any, root: Path, mounts: list[str]) -> Any:
    """Prefix every path (or sqlite URL path) under one of ``mounts`` with ``root``."""
    if isinstance(node, dict):
        return {k: _relocate(v, root, mounts) for k, v in node.items()}
    if isinstance(node, list):
        return [_relocate(v, root, mounts) for v in node]
    if isinstance(node, str):
        scheme, path = ("sqlite://", node[9:]) if node.startswith("sqlite:///") else ("", node)
        for m in mounts:
            if path == m or path.startswith(m.rstrip("/") + "/"):
                return scheme + str(root) + path
    return node


def strings(node: Any) -> list[str]:
    """Every string value in a parsed YAML tree."""
    if isinstance(node, dict):
        return [s for v in node.values() for s in strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in strings(v)]
    return [node] if isinstance(node, str) else []


_KEYS: list[tuple[bytes, bytes]] = []  # the one keygen output of this process


def _keygen(signing_key: Path, pseudonym_key: Path, scratch: Path) -> None:
    """A real Ed25519 audit key and pseudonym key; only the private files go into the mounts.

    ``gateway audit keygen`` runs once per process (a CLI start-up each time was most of a
    materialize); every pod laid out after that gets the same stand-in key pair.
    """
    if not _KEYS:
        scratch.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [str(h.require_tool(GATEWAY_CLI)), "audit", "keygen", "--out",
             str(scratch / "audit.pem"), "--pseudonym-key", str(scratch / "pseudonym.key")],
            capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 0, proc.stderr
        _KEYS.append(((scratch / "audit.pem").read_bytes(),
                      (scratch / "pseudonym.key").read_bytes()))
    signing, pseudonym = _KEYS[0]
    signing_key.write_bytes(signing)
    pseudonym_key.write_bytes(pseudonym)


def config_path(objs: list[dict[str, Any]]) -> str:
    """The ``--config`` argument of the gateway container."""
    args: list[str] = gateway_container(objs)["args"]
    return args[args.index("--config") + 1]


def update_config_map(target: Path, files: dict[str, str], version: str) -> None:
    """Write ``files`` as a new version of a ConfigMap directory mount, as the kubelet does:
    a new ``..<version>`` directory, then ``..data`` swapped to it in one rename."""
    target.mkdir(parents=True, exist_ok=True)
    (target / f"..{version}").mkdir()
    for key, text in files.items():
        (target / f"..{version}" / key).write_text(text, encoding="utf-8")
        link = target / key
        if not link.is_symlink():
            link.symlink_to(Path("..data") / key)
    tmp = target / "..data_tmp"
    tmp.symlink_to(f"..{version}")
    tmp.rename(target / "..data")


def _fill_mount(root: Path, path: str, volume: dict[str, Any], cm: dict[str, str],
                config_text: str) -> None:
    target = root / path.lstrip("/")
    if "configMap" in volume and volume["subPath"] is None:  # the whole ConfigMap, live mode
        update_config_map(target, {**cm, "config.yaml": config_text}, "v1")
    elif "configMap" in volume:
        target.parent.mkdir(parents=True, exist_ok=True)
        key = volume["subPath"]
        target.write_text(config_text if key == "config.yaml" else cm[key], encoding="utf-8")
    elif "secret" in volume:
        target.mkdir(parents=True, exist_ok=True)
        for item in volume["secret"].get("items", []):
            content = {"keys": KEYS_YAML, "audit-db": AUDIT_DB_URL}.get(volume["name"],
                                                                        BACKEND_KEY)
            (target / item["path"]).write_text(content, encoding="utf-8")
    else:  # emptyDir and PersistentVolumeClaims start empty
        target.mkdir(parents=True, exist_ok=True)


def materialize(objs: list[dict[str, Any]], root: Path) -> PodFiles:
    """Lay out the gateway pod of ``objs`` (a chart render) under ``root``.

    Raises:
        AssertionError: the render has no ConfigMap with config.yaml, or a Secret mount the
            audit keys need is missing.
    """
    cm = h.one(objs, "ConfigMap", CONFIG_MAP)["data"]
    mounts = _mounts(objs)
    order = sorted(mounts, key=len, reverse=True)
    config = _relocate(yaml.safe_load(cm["config.yaml"]), root, order)
    config_text = yaml.safe_dump(config, sort_keys=False)
    for path, volume in mounts.items():
        _fill_mount(root, path, volume, cm, config_text)
    audit = config["audit"]
    _keygen(Path(audit["signing_key_file"]), Path(audit["pseudonym_key_file"]),
            root / "scratch")
    backend = [m for m, v in mounts.items() if v["name"] == "backend-credentials"]
    for s in strings(config.get("models", [])):
        # The backend-credentials Secret is mounted whole: its file names are the operator's.
        if backend and s.startswith(str(root) + backend[0] + "/"):
            Path(s).write_text(BACKEND_KEY, encoding="utf-8")
    where = config_path(objs)
    config_file = root / where.lstrip("/")
    assert config_file.is_file(), "config.yaml is not mounted at " + where
    return PodFiles(root, config_file, config, mounts, objs)


def check_config(config_file: Path) -> tuple[int, dict[str, Any]]:
    """Run the real ``gateway check-config --json``; return (exit code, parsed JSON)."""
    proc = subprocess.run(
        [str(h.require_tool(GATEWAY_CLI)), "check-config", "--json", "--config", str(config_file)],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.stdout.strip(), proc.stderr
    result: dict[str, Any] = yaml.safe_load(proc.stdout)
    return proc.returncode, result
