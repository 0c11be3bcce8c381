"""``gateway preflight``'s report, as an operator reads it: on an 80-column terminal and piped.

The report printed one line per check, ``STATUS  check-id  verdict``, however long the verdict:
88 and 92 columns for two skipped checks, 300 for a failed ``policy.destinations`` naming every
destination, which the terminal wrapped back to column 0, across the status column. Now a
verdict goes on under its own column, broken between words, and no line is wider than 80.
"""

from __future__ import annotations

import sys

import pytest

from tests.terminal import ROOT, on_terminal, piped, visible_lines

ARGV = [sys.executable, "-m", "gateway.cli", "preflight", "--policy",
        str(ROOT / "examples" / "policy.yaml"), "--region", "xx-nowhere-1",
        "--retention-days", "10"]
VERDICT_COLUMN = len("FAIL  ") + 24 + 1


@pytest.mark.parametrize("mode", ["terminal", "piped"])
def test_every_report_line_fits_80_columns_and_verdicts_stay_in_their_column(
        mode: str) -> None:
    if mode == "terminal":
        run = on_terminal(ARGV, columns=80)
        lines, rc = visible_lines(run.screen), run.returncode
    else:
        done = piped(ARGV)
        lines, rc = done.stdout.splitlines(), done.returncode
    lines = [line for line in lines if line.strip()]
    text = "\n".join(lines)
    assert rc == 1, text  # two checks fail: the region and the retention
    assert [line for line in lines if len(line) > 80] == [], text
    checks = [line for line in lines if line[:4] in ("PASS", "FAIL", "SKIP")
              and line[4:6] == "  "]
    assert len(checks) == 15, text
    # A continuation line starts in the verdict column, never at column 0 or in the id column.
    rest = [line for line in lines[:-1] if line not in checks]
    assert rest, "no verdict was long enough to wrap: the test shows nothing"
    assert all(line[:VERDICT_COLUMN].isspace() and not line[VERDICT_COLUMN].isspace()
               for line in rest), text
    words = " ".join(text.split())  # a verdict may wrap between words, never inside one
    for phrase in ("destination provider-us is in us-east-1 (non-EU);",
                   "allowed: regions xx-nowhere-1 (--region),",
                   "no Helm values, manifests or kubeconfig with gateway pods",
                   "identity not required (--require-identity, identity.required)",
                   "declared retention 10 days < 183 (six months)"):
        assert phrase in words, f"{phrase!r} split or missing:\n{text}"
    assert lines[-1] == "FAIL: 2 passed, 2 failed, 11 skipped"
