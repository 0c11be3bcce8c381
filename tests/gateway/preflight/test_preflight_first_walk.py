"""What a new operator met running ``gateway preflight`` from the README on a fresh clone.

Run outside the checkout, the default ``--chart helm/sovereign-gateway`` (relative to the
current directory: the chart is not in the installed package) made helm say ``Error: repo helm
not found``, naming neither the path nor ``--chart``. A region failure did not say which
regions were allowed, and verdicts counted "1 containers", "1 default-deny policies".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.gateway.preflight.conftest import HELM
from tests.terminal import ROOT, piped

VALUES = ROOT / "examples" / "values-own-dc.yaml"
POLICY = ROOT / "examples" / "policy-eu.yaml"


def test_outside_the_checkout_the_missing_chart_is_named_with_the_option(tmp_path: Path) -> None:
    run = piped([sys.executable, "-m", "gateway.cli", "preflight", "-f", str(VALUES),
                 "--helm", str(HELM)], cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    assert run.stderr == (
        f"gateway: error [preflight_input]: --values needs the chart, and helm/sovereign-gateway "
        f"(relative to {tmp_path}) is not a chart directory (no Chart.yaml there) (hint: pass "
        "--chart <checkout>/helm/sovereign-gateway, or run from the checkout; --manifests FILE "
        "checks manifests rendered elsewhere)\n")
    assert "repo helm not found" not in run.stderr


def test_a_chart_given_from_elsewhere_renders(tmp_path: Path) -> None:
    run = piped([sys.executable, "-m", "gateway.cli", "preflight", "-f", str(VALUES),
                 "--chart", str(ROOT / "helm" / "sovereign-gateway"), "--helm", str(HELM),
                 "--policy", str(POLICY), "--region", "eu-de-1", "--json"], cwd=tmp_path)
    doc = json.loads(run.stdout)
    verdicts = {c["id"]: c for c in doc["checks"]}
    # One of each in the example values: singular nouns (and verbs) for one.
    assert verdicts["k8s.default-deny"]["verdict"].startswith(
        "1 default-deny policy selects all 2 pods;"), verdicts["k8s.default-deny"]
    assert verdicts["k8s.telemetry-env"]["verdict"].startswith("1 container with "), \
        verdicts["k8s.telemetry-env"]
    # eu-fr-1 is not allowed here: the failure names what was.
    dest = verdicts["policy.destinations"]
    assert dest["status"] == "fail"
    assert dest["verdict"] == ("destination vllm-eu-2 is in eu-fr-1 (EU); allowed: regions "
                               "eu-de-1 (--region), jurisdictions EU (--jurisdiction)")
    assert verdicts["k8s.node-regions"]["verdict"].endswith(
        "; allowed regions: eu-de-1 (from --region)")
    assert run.returncode == 1, run.stderr
