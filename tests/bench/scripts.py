"""Loading the benchmark scripts of ``bench/`` (not a package) in tests.

``bench/*.py`` import each other by their plain names (``from relay_procs import ...``), as
they do when run as scripts; ``bench_module(name)`` loads one under that name after the
siblings it imports that way.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench"
# What each script imports from its siblings, in an order that satisfies their own imports.
_SIBLINGS = {
    "relay": ("relay_load", "relay_procs", "relay_harness", "relay_report"),
    "relay_report": ("relay_procs",),
    "relay_harness": ("relay_load", "relay_procs"),
    "routing": ("relay_procs", "routing_load", "routing_mixed"),
    "routing_mixed": ("relay_procs",),
}


def bench_module(name: str) -> ModuleType:
    """The module ``bench/<name>.py``, loaded once under ``name`` (after its siblings)."""
    if name in sys.modules:
        return sys.modules[name]
    for sibling in _SIBLINGS.get(name, ()):
        bench_module(sibling)
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
