"""Run the ``gateway`` command in-process through its real entry point (the shared CLI boundary).

typer's ``CliRunner`` on a sub-app (``gateway.cli.audit.app``) skips ``main()``, which is where
errors become the one error line and their exit status; these tests go through ``main()``.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

from gateway.cli import main


@dataclass(frozen=True)
class CliResult:
    """Exit status and everything printed (standard output and error, interleaved)."""

    exit_code: int
    output: str


def gateway(*args: str) -> CliResult:
    """``gateway ARGS...`` in this process; returns its exit status and output."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        code = main(list(args))
    return CliResult(code, buffer.getvalue())
