"""The chart gives the pod time to drain: terminationGracePeriodSeconds follows drain.timeout_s."""

from __future__ import annotations

import pytest
import sg_helm as h
import yaml


@pytest.mark.parametrize(("timeout_s", "grace_s"), [("30", 35), ("600", 605), ("45", 50)])
def test_termination_grace_period_covers_the_drain_deadline(timeout_s: str, grace_s: int) -> None:
    objs = h.render(h.SCENARIOS["default"], sets={"gateway.drain.timeout_s": timeout_s,
                                                  "gateway.drain.delay_s": "2"})
    deploy = next(o for o in h.by_kind(objs, "Deployment")
                  if o["spec"]["template"]["metadata"]["labels"].get(
                      "app.kubernetes.io/component") == "gateway")
    assert deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace_s
    cm = next(o for o in h.by_kind(objs, "ConfigMap") if "config.yaml" in o.get("data", {}))
    drain = yaml.safe_load(cm["data"]["config.yaml"])["drain"]
    assert drain == {"delay_s": 2, "timeout_s": float(timeout_s)}


def test_a_drain_longer_than_an_hour_is_refused() -> None:
    err = h.refuse(h.SCENARIOS["default"], sets={"gateway.drain.timeout_s": "7200"})
    assert "/gateway/drain/timeout_s" in err
