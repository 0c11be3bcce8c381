"""``make run`` installs what the example it prints imports.

``make run`` installs the runtime only (``install-runtime``: no dev group), and the openai SDK
example the demo prints failed with ``No module named 'openai'``. ``test_gw_cli.py`` runs the
printed examples in the development venv; this test holds the runtime install to the same
snippet: every module the printed Python imports is a distribution that the runtime install
syncs (the project's dependencies plus the extras its ``uv sync`` line names).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from gateway.cli.demo import examples

ROOT = Path(__file__).resolve().parents[2]


def _runtime_sync_line() -> str:
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(VENV)/.installed-runtime:", 1)[1].split("\n\n", 1)[0]
    (line,) = [x for x in recipe.splitlines() if " sync " in x]
    return line


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_runtime_install_has_every_module_the_printed_example_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    line = _runtime_sync_line()
    assert "--no-dev" in line  # the runtime set: what an operator's make run gets
    installed = _names(project["dependencies"])
    for extra in re.findall(r"--extra (\S+)", line):
        installed |= _names(project["optional-dependencies"][extra])
    text = examples("http://127.0.0.1:8080", "sk-demo")
    snippet = text.split("<<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    imported = {node.module.split(".")[0] for node in ast.walk(ast.parse(snippet))
                if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name.split(".")[0] for node in ast.walk(ast.parse(snippet))
                 if isinstance(node, ast.Import) for alias in node.names}
    assert imported == {"openai"}
    assert imported <= installed, f"make run does not install {imported - installed}"
