"""Regenerate the generated sections of the chart README from values.yaml and the schema.

Sections (between HTML comment markers in helm/sovereign-gateway/README.md):

* ``values-table``: one row per documented value. A value is documented by a ``# -- text``
  comment (continued by further ``#`` lines) right above its key in values.yaml; the default is
  the YAML of the value.
* ``eu-regions``: the EU region list of values.schema.json (``$defs/euRegion``), by provider.

Usage: ``python3 tools/helm_docs.py`` rewrites the README; ``--check`` exits 1 when it is stale.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "helm" / "sovereign-gateway"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?P<rest>.*)$")


def _lookup(values: dict[str, Any], path: list[str]) -> Any:
    node: Any = values
    for part in path:
        node = node[part]
    return node


def _default(value: Any) -> str:
    text = json.dumps(value, separators=(", ", ": "))
    return f"`{text}`".replace("|", "\\|")


def values_table(values_text: str) -> str:
    """Markdown table of the documented values (key, default, description)."""
    values = yaml.safe_load(values_text)
    rows = ["| Key | Default | Description |", "| --- | --- | --- |"]
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for line in values_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            pending = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped[1:].strip())
            continue
        match = _KEY.match(line)
        if not match or stripped.startswith("-"):
            pending = None
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        if pending is not None:
            path = [k for _, k in stack]
            desc = " ".join(pending).replace("|", "\\|")
            rows.append(f"| `{'.'.join(path)}` | {_default(_lookup(values, path))} | {desc} |")
        pending = None
    return "\n".join(rows)


def region_list(schema: dict[str, Any]) -> str:
    """Markdown list of the built-in EU regions by provider."""
    comment: str = schema["$defs"]["euRegion"]["$comment"]
    lines = []
    for group in comment.removeprefix("Providers: ").split("; "):
        provider, regions = group.split(": ", 1)
        codes = ", ".join(f"`{r}`" for r in regions.split(", "))
        lines.append(f"- **{provider}**: {codes}")
    return "\n".join(lines)


def _replace(text: str, section: str, body: str) -> str:
    start, end = f"<!-- {section}:start -->", f"<!-- {section}:end -->"
    if start not in text or end not in text:
        raise ValueError(f"README lacks the {start} ... {end} markers")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def render(readme: str) -> str:
    """Return the README with both generated sections brought up to date."""
    values_text = (CHART / "values.yaml").read_text(encoding="utf-8")
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    readme = _replace(readme, "values-table", values_table(values_text))
    return _replace(readme, "eu-regions", region_list(schema))


def main(argv: list[str] | None = None) -> int:
    """Rewrite or check the README; exit 0 ok, 1 stale (with --check), 2 I/O error."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the README is stale")
    args = parser.parse_args(argv)
    path = CHART / "README.md"
    try:
        current = path.read_text(encoding="utf-8")
        fresh = render(current)
    except (OSError, ValueError, KeyError) as exc:
        print(f"helm_docs: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if fresh != current:
            print("helm_docs: README.md is stale; run python3 tools/helm_docs.py", file=sys.stderr)
            return 1
        return 0
    path.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
