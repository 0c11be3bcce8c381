"""What the ``policy`` commands share: the policy-file argument, ``--json``, the usage error
(exit 2) and the console they print to."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from clishell import CliError

PolicyFile = Annotated[Path, typer.Argument(help="Policy YAML file.", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


class UsageError(CliError):
    """A problem with the command line or an input file other than the policy (exit 2)."""

    def __init__(self, message: str) -> None:
        super().__init__("usage_error", message)


def console() -> Console:
    """The console a command prints its tables to (stdout)."""
    # Not a terminal (pipes, CI logs): 80 columns, the width a file or a log is read at; the
    # tables' cells wrap at word boundaries and fold only a token longer than their column.
    # emoji=False: rich replaces ":name:" codes even in escaped text, and IPv6 addresses are
    # full of them ("[2001:db8::a:b]" printed as "2001:db8:🅰b").
    return Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 80)
