"""Run the ``weights`` CLI in a subprocess with a controlled environment."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.conftest import default_signals

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


# Deliver ``SIG`` to the main thread right after the ``after``-th call of ``OWNER.ATTR`` (as a
# terminal's Ctrl-C or ``kill`` reaches a tool), then go on as usual: the CLI's own signal
# handling must stop the command and clean up. Deterministic, no timing.
_INTERRUPT_WRAPPER = """
import importlib, signal, sys, threading
owner = importlib.import_module({module!r})
for name in {path!r}:
    owner = getattr(owner, name)
original = getattr(owner, {attr!r})
calls = []
def hooked(*a, **k):
    result = original(*a, **k)
    calls.append(1)
    if len(calls) == {after}:
        signal.pthread_kill(threading.main_thread().ident, signal.{sig})
    return result
setattr(owner, {attr!r}, hooked)
from {cli} import main
sys.exit(main(sys.argv[1:]))
"""


def run_interrupted(
    module: str, owner: tuple[str, ...], attr: str, sig: str, args: list[str], *,
    cli: str = "weights.cli", after: int = 2, endpoint: str | None = None,
    shell_status: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run ``cli`` ARGS in a child with default signal dispositions, interrupted by ``sig``
    after the ``after``-th call of ``module.owner.attr``.

    With ``shell_status``, the child runs under ``sh -c`` and the last stdout line is
    ``status=$?`` as that shell saw it (128 + N for a child that died by signal N)."""
    code = _INTERRUPT_WRAPPER.format(module=module, path=owner, attr=attr, sig=sig,
                                     after=after, cli=cli)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env["HF_ENDPOINT"] = endpoint or "http://192.0.2.1:9"
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env["HF_HOME"] = str(Path(tempfile.gettempdir()) / "weights-tests-hf-home")
    env["PYTHONPATH"] = str(ROOT)
    argv = [sys.executable, "-c", code, *args]
    if shell_status:
        argv = ["sh", "-c", '"$@"; echo "status=$?"', "sh", *argv]
    return subprocess.run(default_signals(argv), capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120, check=False)
