"""Run the ``weights`` CLI in a subprocess with a controlled environment."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_cli(
    args: list[str], *, endpoint: str | None = None, extra_env: dict[str, str] | None = None,
    cwd: Path | None = None, python_args: list[str] | None = None, text: bool = True,
) -> subprocess.CompletedProcess[Any]:
    """Run ``python -m weights.cli ARGS``; HF_ENDPOINT set to ``endpoint`` (or unroutable)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env["HF_ENDPOINT"] = endpoint or "http://192.0.2.1:9"  # TEST-NET-1: must never be reached
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env["HF_HOME"] = str(Path(tempfile.gettempdir()) / "weights-tests-hf-home")
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, *(python_args or []), "-m", "weights.cli", *args],
        capture_output=True, text=text, env=env, cwd=cwd or ROOT, timeout=120, check=False,
    )
