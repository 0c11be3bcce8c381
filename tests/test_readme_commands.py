"""The README's table of command-line tools names every command the CLIs have, and no other;
its package table names every sub-package of the gateway.

A newcomer reads the table to learn what exists: ``weights keygen`` (the key ``weights sign``
takes) and ``gateway audit verify-export`` (the check of an AI Act export) were missing from it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clishell import click_command
from tests.clishell.test_cli_shell import APPS

ROOT = Path(__file__).resolve().parents[1]
# (program, group): the command groups whose commands the table lists as ``a|b|c``.
GROUPS = [("gateway", "keys"), ("gateway", "audit"), ("policy", None), ("weights", None),
          ("airgap", None)]


def _table_names(prog: str, group: str | None) -> set[str]:
    """The commands of ``prog [group]`` named by the first code span of a row of the table."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("## Command-line tools"):]
    table = table[:table.index("\n\n", table.index("| Command |"))]
    prefix = f"{prog} {group} " if group else f"{prog} "
    names: set[str] = set()
    for span in re.findall(r"^\| `([^`]+)`", table, re.M):
        if span.startswith(prefix):
            names.update(span[len(prefix):].split(" ")[0].split("|"))
    return names


def _cli_names(prog: str, group: str | None) -> set[str]:
    command = click_command(APPS[prog])
    if group:
        command = command.commands[group]
    return set(command.commands)


@pytest.mark.parametrize(("prog", "group"), GROUPS, ids=[" ".join(filter(None, g)) for g in GROUPS])
def test_the_readme_names_every_command(prog: str, group: str | None) -> None:
    assert _table_names(prog, group) == _cli_names(prog, group)


def test_the_readme_names_every_gateway_subpackage() -> None:
    """The README's package table listed eight of the gateway's sub-packages; ``mcp``,
    ``flow``, ``h1``, ``relay``, ``serving``, ``config``, ``pii`` and ``cli`` were missing."""
    row = next(line for line in (ROOT / "README.md").read_text().splitlines()
               if line.startswith("| `gateway/` |"))
    packages = sorted(p.parent.name for p in (ROOT / "gateway").glob("*/__init__.py"))
    assert [p for p in packages if f"`gateway/{p}/`" not in row] == []
