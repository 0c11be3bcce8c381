"""docs/airgap.md's workflow packs the chart as a file that its own commands make.

The workflow packed ``sovereign-gateway-0.1.0.tgz`` without saying where it comes from; it is
what ``helm package`` writes for the chart's version, and that name changes with the version.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_the_packed_chart_is_made_by_the_workflow_with_the_charts_version() -> None:
    doc = (ROOT / "docs" / "airgap.md").read_text()
    workflow = re.findall(r"^```sh\n(.*?)^```", doc, re.S | re.M)[0]
    chart = yaml.safe_load((ROOT / "helm" / "sovereign-gateway" / "Chart.yaml").read_text())
    packed = re.findall(r"--include-file (\S+\.tgz)", workflow)
    assert packed == [f"{chart['name']}-{chart['version']}.tgz"], packed
    assert workflow.index("helm package") < workflow.index("airgap pack"), workflow
