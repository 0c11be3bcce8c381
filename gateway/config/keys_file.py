"""``keys_file``: API key entries kept in their own YAML file (for example a mounted Secret).

The gateway config may name ``keys_file: path`` (relative to the config file) holding a YAML list
shaped exactly like the config's ``keys`` list. Its entries are appended to the inline ``keys``;
an id or digest present in both (or twice in the file) is an error naming both places. Problems
inside the file are reported as ``keys_file (<path>)[<index>].<field>: <problem>``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from clishell import read_input_text
from gateway.config.errors import DuplicateKeyError, compose_yaml, dotted

__all__ = ["merge_keys_file", "relabel_keys"]

_KEY_INDEX = re.compile(r"\bkeys\[(\d+)\]")


def _kind(value: object) -> str:
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def _read(path: Path) -> tuple[list[Any] | None, str | None]:
    try:
        text = read_input_text(path)
    except OSError as exc:
        return None, f"keys_file: cannot read {path}: {exc.strerror}"
    except UnicodeDecodeError:
        return None, f"keys_file: {path} is not UTF-8 text"
    try:
        # As the config file itself: a key written twice in one entry is refused (PyYAML would
        # keep the last one silently, so the reviewed Secret could mean something else).
        loaded, _ = compose_yaml(yaml.SafeLoader(text))
    except DuplicateKeyError as exc:
        return None, (f"keys_file ({path}){dotted(exc.path).removeprefix('(top level)')}: "
                      f"duplicate key {exc.path[-1]!r} (line {exc.line} of {path})")
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        return None, f"keys_file: {where}: not valid YAML: {exc.problem}"
    except yaml.YAMLError as exc:
        return None, f"keys_file: {path}: not valid YAML: {' '.join(str(exc).split())}"
    except RecursionError:
        return None, f"keys_file: {path}: the YAML refers to itself or nests too deeply"
    if loaded is None:
        return None, f"keys_file: {path} is empty; it must hold a YAML list of keys"
    if not isinstance(loaded, list):
        return None, f"keys_file: {path} must hold a YAML list of keys (got a {_kind(loaded)})"
    return loaded, None


def merge_keys_file(data: dict[str, Any], base: Path) -> tuple[list[str], list[str]]:
    """Move the entries of ``data["keys_file"]`` into ``data["keys"]`` (in place).

    Args:
        data: The config mapping (a private copy; ``keys_file`` is removed from it).
        base: Directory a relative ``keys_file`` is resolved against (the config file's).

    Returns:
        ``(labels, problems)``: ``labels[i]`` names where merged ``keys[i]`` came from
        (``keys[3]`` or ``keys_file (/etc/keys.yaml)[0]``), for :func:`relabel_keys`;
        ``problems`` has one message per unreadable file or duplicate id/digest.
    """
    inline = data.get("keys")
    labels = [f"keys[{i}]" for i in range(len(inline))] if isinstance(inline, list) else []
    if "keys_file" not in data:
        return labels, []
    name = data.pop("keys_file")
    if not isinstance(name, str) or not name:
        return labels, [f"keys_file: must be a file path (got {_kind(name)} {name!r})"]
    path = Path(name) if Path(name).is_absolute() else base / name
    entries, problem = _read(path)
    if problem is not None or entries is None:
        return labels, [problem or f"keys_file: {path} unreadable"]
    if inline is not None and not isinstance(inline, list):
        return labels, []  # the model reports ``keys`` itself
    merged: list[Any] = list(inline or [])
    problems: list[str] = []
    ids: dict[object, str] = {}
    digests: dict[object, str] = {}
    for i, entry in enumerate(merged):
        if isinstance(entry, dict):
            ids.setdefault(_hashable(entry.get("id")), labels[i])
            digests.setdefault(_digest(entry.get("sha256")), labels[i])
    for j, entry in enumerate(entries):
        label = f"keys_file ({path})[{j}]"
        if isinstance(entry, dict):
            key_id, digest = _hashable(entry.get("id")), _digest(entry.get("sha256"))
            if key_id is not None and key_id in ids:
                problems.append(f"{label}.id: duplicate key id {key_id!r} (also {ids[key_id]})")
                continue
            if digest is not None and digest in digests:
                problems.append(f"{label}.sha256: same digest as {digests[digest]}")
                continue
            ids[key_id] = label
            digests[digest] = label
        merged.append(entry)
        labels.append(label)
    data["keys"] = merged
    return labels, problems


def _digest(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else _hashable(value)


def _hashable(value: object) -> object:
    return value if isinstance(value, (str, int, float, bool)) or value is None else repr(value)


def relabel_keys(message: str, labels: list[str]) -> str:
    """Rewrite ``keys[i]`` in a validation message to the place the entry came from."""

    def sub(match: re.Match[str]) -> str:
        index = int(match.group(1))
        return labels[index] if index < len(labels) else match.group(0)

    return _KEY_INDEX.sub(sub, message)
