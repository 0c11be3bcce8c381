"""Shared set-up for the egress wiring tests: three simulators as EU/EU/US replicas and a policy."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

KEYS = {
    "conf": "sg-egress-conf",
    "pub": "sg-egress-pub",
    "contractor": "sg-egress-contractor",
    "internal": "sg-egress-internal",
    "research": "sg-egress-research",
}
_KEY_ROWS = [
    ("k-conf", "conf", "eng", "confidential"),
    ("k-pub", "pub", "eng", "public"),
    ("k-contractor", "contractor", "contractors", "public"),
    ("k-internal", "internal", "eng", "internal"),
    ("k-research", "research", "research", "public"),
]
REGIONS = {"eu-a": "eu-de-1", "eu-b": "eu-fr-1", "us": "us-east-1"}


def policy_text(ports: dict[str, int], *, extra_destinations: str = "",
                unsafe: bool = False) -> str:
    """The test policy: confidential -> EU + no-retention only; public anywhere."""
    d = "{id: %s, host: 127.0.0.1, port: %d, region: %s, jurisdiction: %s, operator: %s%s}"
    lines = [
        d % ("eu-a", ports["eu-a"], REGIONS["eu-a"], "EU", "acme", ", tags: [no-retention]"),
        d % ("eu-b", ports["eu-b"], REGIONS["eu-b"], "EU", "acme", ""),
        d % ("us", ports["us"], REGIONS["us"], "non-EU", "other", ""),
    ]
    return (
        "version: 1\ndata_classes: [public, internal, confidential]\n"
        "classification:\n  grants:\n"
        "    - {id: research-may-raise, teams: [research], raise: true}\n"
        "destinations:\n"
        + "".join(f"  - {line}\n" for line in lines)
        + extra_destinations
        + "rules:\n"
        "  - {id: block-contractor, effect: deny, principals: {teams: [contractors]}}\n"
        "  - id: confidential-eu-no-retention\n"
        "    classes: [confidential]\n"
        "    constraints: {jurisdiction: EU, require_tags: [no-retention]}\n"
        "  - {id: public-anywhere, classes: [public]}\n"
        + ("unsafe_allow_all: true\n" if unsafe else "")
    )


def gateway_config(urls: dict[str, str], policy_file: Path, guard: str = "off",
                   port: int = 0) -> dict[str, Any]:
    """A gateway config with model ``m`` over the three replicas (US first) and five keys."""
    return {
        "listen": {"host": "127.0.0.1", "port": port},
        "models": [{"name": "m", "replicas": [
            {"url": urls[n], "destination": n} for n in ("us", "eu-b", "eu-a")]}],
        "keys": [
            {"id": kid, "sha256": hashlib.sha256(KEYS[who].encode()).hexdigest(),
             "models": ["m"], "team": team, "data_class": cls}
            for kid, who, team, cls in _KEY_ROWS
        ],
        "health": {"active": False},
        "logging": {"access_log": False},
        "drain": {"delay_s": 0},  # no load balancer in front: a stop need not wait 5 s
        "policy": {"file": str(policy_file), "guard": guard},
    }
