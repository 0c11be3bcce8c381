"""No import circles in the product packages (issue 29).

Every module of ``gateway``, ``policy``, ``weights``, ``airgap``, ``vllm_sim`` and ``clishell``
is parsed with :mod:`ast` and every import statement counts: at module level, inside a
function, under ``if TYPE_CHECKING:``. A lazy or type-only import still ties the two modules
together (neither can be understood, moved or tested without the other), so a circle hidden
in a function is a circle.

Edges: ``import a.b`` is an edge to ``a.b``; ``from a import b`` is an edge to ``a.b`` when that
is a module, else to ``a``; relative imports are resolved against the importing module; a
name that is not a product module goes to its nearest product ancestor, and imports of other
packages are ignored. Importing ``a.b`` also runs ``a/__init__.py``, but that implied edge is
not counted: a package's ``__init__`` re-exporting its submodules would otherwise close a
circle with each of them.

The strongly connected components of that graph with more than one module are the circles.
:data:`KNOWN_CIRCLES` lists those not fixed yet; it may only shrink: a circle not in it fails,
and so does an entry that is no longer exactly a circle of the tree (remove it, or replace it
by the smaller circle that is left).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PRODUCT = ("gateway", "policy", "weights", "airgap", "vllm_sim", "clishell")

#: Circles still present, each the exact set of modules of one strongly connected component.
#: Empty: every circle of the product packages was broken (issue 29); keep it so.
KNOWN_CIRCLES: frozenset[frozenset[str]] = frozenset()

#: ``(importer, imported) -> line numbers`` of the import statements making that edge.
Graph = dict[tuple[str, str], list[int]]


def product_modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Map every module name of ``packages`` under ``root`` to its file (packages: ``__init__``).
    """
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _nearest(name: str, modules: Mapping[str, Path]) -> str | None:
    """``name`` or its nearest ancestor that is a product module; ``None`` outside them."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: Mapping[str, Path]) -> Graph:
    """Every import edge between product modules, with the lines that make it.

    Raises:
        SyntaxError: A module does not parse.
    """
    edges: Graph = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = module.split(".") if is_package else module.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    child = f"{base}.{alias.name}"
                    targets.append(child if child in modules else base)
            for target in targets:
                found = _nearest(target, modules)
                if found is not None and found != module:
                    edges.setdefault((module, found), []).append(node.lineno)
    return edges


def circles(modules: Iterable[str], edges: Iterable[tuple[str, str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    succ: dict[str, list[str]] = {m: [] for m in modules}
    for a, b in edges:
        succ[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()
    for start in succ:
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(succ[start]))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(succ[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.add(frozenset(component))
    return found


def describe(circle: frozenset[str], edges: Graph, modules: Mapping[str, Path]) -> str:
    """The circle's modules and each edge inside it with ``file:line`` of its imports."""
    lines = [" <-> ".join(sorted(circle))]
    for (a, b), linenos in sorted(edges.items()):
        if a in circle and b in circle:
            where = ", ".join(f"{modules[a].relative_to(ROOT)}:{n}" for n in sorted(set(linenos)))
            lines.append(f"    {a} -> {b}  ({where})")
    return "\n".join(lines)


@pytest.fixture(scope="module")
def tree() -> tuple[dict[str, Path], Graph, set[frozenset[str]]]:
    modules = product_modules(ROOT, PRODUCT)
    edges = import_graph(modules)
    return modules, edges, circles(modules, edges)


def test_no_import_circle_beyond_the_known_ones(
    tree: tuple[dict[str, Path], Graph, set[frozenset[str]]],
) -> None:
    modules, edges, found = tree
    new = sorted(found - KNOWN_CIRCLES, key=sorted)
    assert not new, f"{len(new)} import circle(s) (not in KNOWN_CIRCLES):\n" + "\n".join(
        describe(c, edges, modules) for c in new)


def test_known_circles_only_shrink(
    tree: tuple[dict[str, Path], Graph, set[frozenset[str]]],
) -> None:
    _, _, found = tree
    gone = sorted(sorted(c) for c in KNOWN_CIRCLES - found)
    assert not gone, ("KNOWN_CIRCLES entries that are no longer a circle of the tree (remove "
                      f"them, or list the smaller circle left instead): {gone}")


def _write(root: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return product_modules(root, ["pkg"])


def test_every_kind_of_import_closes_a_circle(tmp_path: Path) -> None:
    # One circle per import form; each must be found with the edge that closes it.
    modules = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/lazy_a.py": "def f():\n    from pkg.lazy_b import g\n",
        "pkg/lazy_b.py": "import pkg.lazy_a\n",
        "pkg/typed_a.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    from pkg.typed_b import T\n"),
        "pkg/typed_b.py": "from pkg import typed_a\n",
        "pkg/sub/__init__.py": "from . import rel_b\n",
        "pkg/sub/rel_b.py": "from ..sub import VALUE\n",
        "pkg/sub/up.py": "from .. import lazy_a\n",
        "pkg/leaf.py": "import json\nfrom pkg.lazy_a import f\n",
    })
    edges = import_graph(modules)
    assert circles(modules, edges) == {
        frozenset({"pkg.lazy_a", "pkg.lazy_b"}),
        frozenset({"pkg.typed_a", "pkg.typed_b"}),
        frozenset({"pkg.sub", "pkg.sub.rel_b"}),
    }
    assert edges[("pkg.lazy_a", "pkg.lazy_b")] == [2]
    assert edges[("pkg.typed_a", "pkg.typed_b")] == [3]
    assert ("pkg.sub.up", "pkg.lazy_a") in edges
    assert ("pkg.leaf", "pkg.lazy_a") in edges


def test_a_long_circle_is_one_component(tmp_path: Path) -> None:
    n = 3000  # deeper than the recursion limit: the search must not recurse
    files = {"pkg/__init__.py": ""}
    for i in range(n):
        files[f"pkg/m{i}.py"] = f"import pkg.m{(i + 1) % n}\n"
    modules = _write(tmp_path, files)
    assert circles(modules, import_graph(modules)) == {
        frozenset(f"pkg.m{i}" for i in range(n))}
