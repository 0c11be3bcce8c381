"""What a ``gateway serve`` or ``check-config`` without an ``mcp:`` section imports.

jsonschema (the MCP argument checks, :mod:`gateway.mcp.arguments`) builds the grammars of its
optional format checkers at import: about 1.5 s of CPU, more than the rest of the gateway's
start-up imports, paid by every gateway process (and by each of the hundreds that the tests
start) although only an ``mcp:`` section uses it. The import trace is taken through the real
entry point, ``python -X importtime -m gateway.cli check-config``, which assembles the gateway
as ``serve`` does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """\
listen: {host: 127.0.0.1, port: 0}
models:
  - name: m
    replicas: [{url: "http://127.0.0.1:9"}]
"""


def _imported(tmp_path: Path) -> set[str]:
    """Every module the check-config of ``CONFIG`` imports (``-X importtime`` lines)."""
    path = tmp_path / "gateway.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gateway.cli", "check-config", "--config",
         str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [x for x in done.stderr.splitlines() if x.startswith("import time:")]
    return {x.rsplit("|", 1)[1].strip() for x in lines[1:]}  # the first line is the header


def test_a_gateway_without_mcp_does_not_import_the_mcp_schema_checks(tmp_path: Path) -> None:
    modules = _imported(tmp_path)
    assert "gateway.assembly" in modules and "gateway.config.loader" in modules  # it assembled
    assert not {m for m in modules if m.split(".")[0] in ("jsonschema", "rfc3987_syntax")}
    assert "gateway.mcp.arguments" not in modules and "gateway.mcp.wiring" not in modules
