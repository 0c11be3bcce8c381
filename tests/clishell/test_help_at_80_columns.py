"""Every command's ``--help`` reads well on an 80-column terminal.

Nothing is cut with an ellipsis (typer's rich panels cut ``--gpu-memory-utilization`` and
choice lists), no line is wider than the terminal, the usage line names arguments as click does
(``TARGET``, not ``{TARGET}``), and no reStructuredText markup (````x````, ``:func:``) leaks from
a docstring into the help.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator

import pytest

from clishell import click_command
from tests.clishell.test_cli_shell import APPS
from tests.terminal import on_terminal, visible_lines

RST = re.compile(r"``|:(?:func|mod|class|meth|attr|data|exc):`")


def _commands() -> Iterator[tuple[str, list[str]]]:
    for prog, app in APPS.items():
        root = click_command(app)
        yield prog, []
        for name, sub in getattr(root, "commands", {}).items():
            yield prog, [name]
            for inner in getattr(sub, "commands", {}):
                yield prog, [name, inner]


COMMANDS = sorted(_commands())
MODULES = {"gateway": "gateway.cli", "policy": "policy.cli", "weights": "weights.cli",
           "airgap": "airgap.cli", "vllm-sim": "vllm_sim.cli"}


@pytest.mark.parametrize(("prog", "path"), COMMANDS, ids=[" ".join([p, *c]) for p, c in COMMANDS])
def test_help_fits_80_columns_uncut(prog: str, path: list[str]) -> None:
    run = on_terminal([sys.executable, "-m", MODULES[prog], *path, "--help"], columns=80)
    lines = visible_lines(run.screen)
    text = "\n".join(lines)
    assert run.returncode == 0, text
    assert "…" not in text, text
    assert all(len(line) <= 80 for line in lines), text
    usage = next(line for line in lines if line.lstrip().startswith("Usage:"))
    assert "{" not in usage, usage
    assert not RST.search(text), text


def test_serve_help_lists_its_exit_codes_including_3() -> None:
    """Exit 3 (could not start serving) was documented only in docs/gateway.md."""
    run = on_terminal([sys.executable, "-m", "gateway.cli", "serve", "--help"], columns=80)
    text = " ".join(" ".join(visible_lines(run.screen)).split())
    assert run.returncode == 0, text
    for code in ("0 stopped by SIGTERM", "2 the config", "3 the gateway could not start",
                 "130 stopped by SIGINT"):
        assert code in text, text
