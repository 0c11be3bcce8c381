"""The chart's continuous pre-flight alerts: promtool checks and unit-tests them, helm embeds them.

``rules/preflight.rules.yaml`` is a plain Prometheus rule file; the real ``promtool`` (Debian's
prometheus package) runs ``check rules`` and ``test rules`` with series of the metrics the
gateway exports (``sg_preflight_check{check, status}``, ``sg_preflight_last_run_timestamp_seconds``,
``sg_preflight_interval_seconds``): a check that fails for longer than the ``for`` fires, a
passing one and a short blip do not, a stalled loop fires the stale alert.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import sg_helm as h
import yaml

RULES = h.CHART / "rules" / "preflight.rules.yaml"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not on PATH: install Debian's prometheus package "
                    "(.ci/run and `make tools` do)")
    return path


TESTS = Path(__file__).resolve().parent / "preflight.rules.test.yaml"


def test_promtool_checks_the_rules() -> None:
    res = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 2 rules found" in res.stdout + res.stderr


def test_promtool_unit_tests_fire_on_a_failing_check() -> None:
    res = subprocess.run([_promtool(), "test", "rules", str(TESTS)], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_promtool_test_fails_when_the_expected_alert_does_not_fire(tmp_path: Path) -> None:
    """The unit test can fail: expecting the alert during the passing minutes is refused."""
    tests = tmp_path / "preflight.tests.yaml"
    text = TESTS.read_text().replace("eval_time: 16m", "eval_time: 8m", 1)
    tests.write_text(text.replace("../../helm/sovereign-gateway/rules/preflight.rules.yaml",
                                  str(RULES)))
    res = subprocess.run([_promtool(), "test", "rules", str(tests)], capture_output=True,
                         text=True)
    assert res.returncode != 0
    assert "SovereignGatewayPreflightCheckFailed" in res.stdout + res.stderr


def test_chart_embeds_the_tested_rules() -> None:
    default = h.SCENARIOS["default"]
    assert not h.by_kind(h.render(default), "PrometheusRule")  # off by default
    objs = h.render(default, sets={"prometheusRule.enabled": "true",
                                   "prometheusRule.labels.release": "kube-prometheus"})
    rule = next(o for o in objs if o["kind"] == "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
