"""Cost of the egress policy (+ process guard) and of telemetry on the relay, in one run.

Writes four gateway variant configs that differ only by their ``policy:`` (guard ``enforce``)
and ``telemetry:`` sections, and runs ``bench/relay.py`` with them as variants (``base``,
``policy``, ``telemetry``, ``all``), so every ratio comes from the same interleaved run.

The simulator's port is only known when ``relay.py`` starts it, so the policy's one destination
is ``127.0.0.1/32`` with every port of the kernel's ephemeral range (where free ports come from).

Usage::

    .venv/bin/python bench/policy_telemetry.py [relay.py options, e.g. --skip memory --rounds 5]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent


def _ephemeral_ports() -> range:
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        lo, hi = 32768, 60999
    return range(lo, hi + 1)


def _policy() -> dict[str, Any]:
    return {
        "version": 1,
        "data_classes": ["public", "internal", "confidential"],
        "destinations": [{
            "id": "sim", "cidr": "127.0.0.1/32", "ports": list(_ephemeral_ports()),
            "region": "eu-de-1", "jurisdiction": "EU", "operator": "bench",
            "tags": ["no-retention"],
        }],
        "rules": [
            {"id": "contractors-out", "effect": "deny", "principals": {"teams": ["contractors"]}},
            {"id": "internal-eu", "classes": ["internal", "confidential"],
             "constraints": {"jurisdiction": "EU", "require_tags": ["no-retention"]}},
        ],
    }


def _variant(policy_file: Path | None, telemetry: bool) -> dict[str, Any]:
    replica: dict[str, Any] = {"url": "http://127.0.0.1:1"}
    cfg: dict[str, Any] = {
        "models": [{"name": "m", "replicas": [replica]}],
        "keys": [],
        "health": {"active": False},
        "logging": {"access_log": False},
    }
    if policy_file is not None:
        replica["destination"] = "sim"
        cfg["policy"] = {"file": str(policy_file), "guard": "enforce"}
    if telemetry:
        cfg["telemetry"] = {"admin": {"port": 0}, "sample_ratio": 1.0}
    return cfg


def main(argv: list[str]) -> int:
    """Write the variants and run relay.py with them; returns its exit code."""
    with tempfile.TemporaryDirectory(prefix="sg-bench-pt-") as tmp:
        d = Path(tmp)
        pfile = d / "policy.yaml"
        # Flow style keeps the 28k-port list on one line (the policy loader bounds the size).
        pfile.write_text(yaml.safe_dump(_policy(), default_flow_style=None, width=1 << 30))
        variants = []
        for name, pol, tel in (("base", None, False), ("policy", pfile, False),
                               ("telemetry", None, True), ("all", pfile, True)):
            path = d / f"gateway-{name}.yaml"
            path.write_text(yaml.safe_dump(_variant(pol, tel)))
            variants += ["--variant", f"{name}={path}"]
        cmd = [sys.executable, str(HERE / "relay.py"), *variants, *argv]
        return subprocess.run(cmd, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
