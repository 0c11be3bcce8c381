"""A real ``gateway serve`` (subprocess) fronting MCP servers on loopback, with the egress
policy and the audit log on, for the MCP tests."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.audit import Signer, generate_key_file, write_key_pair
from tests.conftest import free_port
from tests.gateway.helpers import audit_export

ROOT = Path(__file__).parents[3]
KEYS = {"agent": "sg-mcp-agent", "secret": "sg-mcp-secret", "other": "sg-mcp-other",
        "nobody": "sg-mcp-nobody"}
_ROWS = [("k-agent", "agent", "agents", "internal"), ("k-secret", "secret", "agents", "secret"),
         ("k-other", "other", "agents", "internal"),
         ("k-nobody", "nobody", "outsiders", "internal")]


def policy_text(ports: dict[str, int], extra: str = "") -> str:
    """Destinations: the model replica, each MCP server (``tools-*``: internal data only),
    ``web`` (a fetchable site) and an OTLP ``collector`` if given; the ``secret`` class may go
    nowhere but the model."""
    purposes = {"model": "inference", "collector": "telemetry"}
    dests = "".join(
        f"  - {{id: {name}, host: 127.0.0.1, port: {port}, region: eu-de-1, jurisdiction: EU, "
        f"operator: acme, purpose: {purposes.get(name, 'tool')}}}\n"
        for name, port in ports.items())
    return (
        "version: 1\ndata_classes: [public, internal, secret]\n"
        "destinations:\n" + dests +
        "rules:\n"
        "  - {id: secret-model-only, classes: [secret], destinations: [model]}\n"
        "  - {id: internal-anywhere, classes: [public, internal]}\n" + extra
    )


@dataclass
class Gateway:
    """The running gateway."""

    url: str
    db: Path
    proc: subprocess.Popen[bytes]
    admin_port: int = 0
    stderr: bytes = b""
    cfg: dict[str, Any] = field(default_factory=dict)
    since: str | None = None
    """ISO 8601 UTC time: :meth:`records` holds the records written from then on only."""

    def mcp(self, server: str) -> str:
        """URL of ``/mcp/<server>``."""
        return f"{self.url}/mcp/{server}"

    def from_now(self) -> Gateway:
        """This gateway as one test sees it when several share it: its :meth:`records` start
        now (``gateway audit export --since``), so a test reads only what it caused."""
        return replace(self, since=datetime.now(UTC).isoformat())

    def records(self) -> list[dict[str, Any]]:
        """The audit chain (from :attr:`since` if set), as ``gateway audit export`` prints it
        (read in this process: :func:`tests.gateway.helpers.audit_export`)."""
        return audit_export(f"sqlite://{self.db}", self.since)

    def metrics(self, prefix: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Samples of the admin ``/metrics`` page whose names start with ``prefix``."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"http://127.0.0.1:{self.admin_port}/metrics", timeout=10).text
        return {(("__name__", smp.name), *sorted(smp.labels.items())): smp.value
                for fam in text_string_to_metric_families(text) for smp in fam.samples
                if smp.name.startswith(prefix)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, self.stderr = self.proc.communicate(timeout=30)


def start_gateway(tmp_path: Path, model_url: str, servers: dict[str, str],
                  extra_ports: dict[str, int], mcp_extra: Callable[[dict[str, Any]], None]
                  | None = None, policy_extra: str = "",
                  cfg_extra: Callable[[dict[str, Any]], None] | None = None) -> Gateway:
    """Write the policy and config, start ``gateway serve``, wait for ``/healthz``.

    Args:
        model_url: The simulator's URL (model ``m``, destination ``model``).
        servers: MCP server name -> its MCP endpoint URL (destination ``tools-<name>``).
        extra_ports: More destinations by id (``web``).
        mcp_extra: Edits the ``mcp:`` section in place.
        policy_extra: Appended to the policy file (top-level sections, e.g. ``pii:``).
        cfg_extra: Edits the whole gateway config in place (e.g. ``telemetry:``).
    """
    ports = {"model": int(model_url.rsplit(":", 1)[1])}
    for name, url in servers.items():
        ports[f"tools-{name}"] = int(url.split(":")[2].split("/")[0])
    ports.update(extra_ports)
    pfile = tmp_path / "policy.yaml"
    pfile.write_text(policy_text(ports, policy_extra))
    port = free_port()
    key, _ = write_key_pair(Signer.generate(), tmp_path / "audit.key")
    db = tmp_path / "audit.db"
    mcp: dict[str, Any] = {
        "servers": [{"name": n, "url": u, "destination": f"tools-{n}"}
                    for n, u in servers.items()],
        "access": [
            {"teams": ["agents"], "allow": ["*"], "deny": ["delete_*"]},
        ],
        "resource_metadata": {"resource": f"http://127.0.0.1:{port}",
                              "authorization_servers": ["https://id.example.eu"]},
    }
    if mcp_extra is not None:
        mcp_extra(mcp)
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "models": [{"name": "m", "replicas": [{"url": model_url, "destination": "model"}]}],
        "keys": [{"id": kid, "sha256": hashlib.sha256(KEYS[who].encode()).hexdigest(),
                  "models": ["m"], "team": team, "data_class": cls}
                 for kid, who, team, cls in _ROWS],
        "health": {"active": False},
        "logging": {"access_log": False},
        # No load balancer in front: a stop need not keep accepting for the default 5 s.
        "drain": {"delay_s": 0},
        "policy": {"file": str(pfile), "guard": "enforce"},
        "audit": {"store": f"sqlite://{db}", "signing_key_file": str(key),
                  "replica_id": "mcp-test",
                  "pseudonym_key_file": str(generate_key_file(tmp_path / "pseudonym.key"))},
        "mcp": mcp,
        "telemetry": {"admin": {"host": "127.0.0.1", "port": (admin := free_port())}},
    }
    if cfg_extra is not None:
        cfg_extra(cfg)
    cfg_file = tmp_path / "gateway.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg_file)], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE,
        start_new_session=True)
    gw = Gateway(f"http://127.0.0.1:{port}", db, proc, admin_port=admin, cfg=cfg)
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(gw.url + "/healthz", timeout=1).raise_for_status()
            return gw
        except httpx.HTTPError:
            if proc.poll() is not None:
                gw.stop()
                raise AssertionError("gateway exited: " + gw.stderr.decode()[-3000:]) from None
            if time.monotonic() > deadline:
                gw.stop()
                raise AssertionError("gateway did not start") from None
            time.sleep(0.1)
