"""The gateway's egress CIDRs may not together allow every address, however they are split.

The schema refuses ``0.0.0.0/0`` and ``::/0`` one CIDR at a time; the template refuses any set
of CIDRs (egress destinations, the audit database, the telemetry collector) whose union is
every IPv4 or every IPv6 address, whatever the ports. Checked with real ``helm template``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sg_helm as h
import yaml

DEFAULT = h.SCENARIOS["default"]


def _egress(tmp_path: Path, mirror: list[str], external: list[str]) -> Path:
    path = tmp_path / "egress.yaml"
    path.write_text(yaml.safe_dump({"egress": {"destinations": [
        {"id": "model-mirror", "cidrs": mirror, "ports": [{"port": 443, "protocol": "TCP"}],
         "fqdn": "mirror.models.internal.example"},
        {"id": "vllm-external", "cidrs": external, "ports": [{"port": 8000, "protocol": "TCP"}],
         "fqdn": None}]}}), encoding="utf-8")
    return path


@pytest.mark.parametrize(("mirror", "external", "version"), [
    (["0.0.0.0/1"], ["128.0.0.0/1"], "4"),  # two halves on two ports
    (["0.0.0.0/2", "64.0.0.0/2", "10.0.0.0/8"], ["128.0.0.0/1"], "4"),
    (["::/1"], ["8000::/1", "10.20.0.0/24"], "6"),
    (["0:0::/2", "4000::/2"], ["8000:0:0:0:0:0:0:0/1"], "6"),
    (["::ffff:0.0.0.0/97"], ["::ffff:128.0.0.0/97"], "4"),  # IPv4-mapped: the IPv4 halves
    (["::FFFF:0:0/96"], ["10.20.0.0/24"], "4"),
])
def test_cidrs_that_together_cover_everything_are_refused(
        tmp_path: Path, mirror: list[str], external: list[str], version: str) -> None:
    err = h.refuse(DEFAULT, _egress(tmp_path, mirror, external))
    assert (f"the gateway's egress CIDRs together allow every IPv{version} address, as "
            f"{'0.0.0.0/0' if version == '4' else '::/0'} would (") in err, err
    assert "an egress rule may never allow any address" in err


def test_database_and_destinations_together_are_refused(tmp_path: Path) -> None:
    db = tmp_path / "db.yaml"
    db.write_text(yaml.safe_dump({"replicaCount": 1, "audit": {"store": {
        "type": "postgresql", "postgresql": {"existingSecret": "db", "cidrs": ["0.0.0.0/1"]}}}}))
    err = h.refuse(DEFAULT, db, _egress(tmp_path, ["128.0.0.0/1"], ["10.20.0.0/24"]))
    assert "together allow every IPv4 address, as 0.0.0.0/0 would (128.0.0.0/1, 10.20.0.0/24, " \
           "0.0.0.0/1, from egress.destinations" in err, err


@pytest.mark.parametrize(("mirror", "external"), [
    (["0.0.0.0/1"], ["128.0.0.0/2", "192.0.0.0/3", "224.0.0.0/4", "240.0.0.0/5"]),  # not all
    (["::/1"], ["8000::/2", "c000::/3", "2001:db8::/32"]),
    (["10.30.1.0/28", "::ffff:10.0.0.0/104"], ["10.20.0.0/24", "2001:db8::a:b/128"]),
])
def test_broad_sets_short_of_everything_still_render(
        tmp_path: Path, mirror: list[str], external: list[str]) -> None:
    objs = h.render(DEFAULT, _egress(tmp_path, mirror, external))
    egress = h.one(objs, "NetworkPolicy", "sg-sovereign-gateway-gateway-egress")
    cidrs = {p["ipBlock"]["cidr"] for r in egress["spec"]["egress"] for p in r["to"]
             if "ipBlock" in p}
    assert set(mirror) | set(external) <= cidrs
