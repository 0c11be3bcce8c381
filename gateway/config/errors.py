"""Configuration problems as one-line ``file:line: key: problem`` messages (the one formatter).

Every configuration check of the gateway reports through this module: pydantic validation
errors of every section (:func:`validation_problems`), the checks
:func:`gateway.config.loader.load`
makes before and after validation (secrets, ``keys_file``), and the checks ``check-config``
runs on the loaded settings (policy binding, TLS files, audit key files). The format follows
the policy loader (``policy/model.py``) and compilers' ``file:line:`` convention, so editors
and CI annotate the right line::

    /etc/sg/gateway.yaml:12: models[0].replicas[1].url: must be an http:// or https:// URL

``key`` is the dotted path of the offending key (``[i]`` for list items, ``.name`` for mapping
keys); ``line`` is the 1-based line of that key in the file, or of its nearest parent that is
written in the file (a missing key is reported on the line of the mapping that lacks it).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from clishell.problems import KeyPath, dotted, line_of, unknown_key
from gateway.errors import ConfigError

__all__ = [
    "ConfigProblem",
    "DuplicateKeyError",
    "InvalidConfig",
    "KeyPath",
    "LineMap",
    "compose_yaml",
    "dotted",
    "line_of",
    "problems_of",
    "validation_problems",
]

LineMap = Mapping[KeyPath, int]

_PREFIX = re.compile(r"^(Value error|Assertion failed), ")
# A message written as "key: problem" by a check that knows the key (``keys[1].models: ...``).
_KEYED = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*(?:\[\d+\]|\.[A-Za-z0-9_-]+)*): (.+)$", re.S)
_PART = re.compile(r"\[(\d+)\]|\.?([A-Za-z0-9_-]+)")


@dataclasses.dataclass(frozen=True)
class ConfigProblem:
    """One problem of a configuration file.

    Attributes:
        key: Dotted key path (``models[0].replicas[1].url``); ``(top level)`` for the document.
        problem: What is wrong, in one line.
        file: The file the key is in (``None`` for a mapping validated without a file).
        line: 1-based line of the key (or of its nearest written parent), when known.
    """

    key: str
    problem: str
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            where = f"{self.file}:{self.line}: " if self.line is not None else f"{self.file}: "
        return f"{where}{self.key}: {self.problem}"

    def as_json(self) -> dict[str, str | int | None]:
        """``{"file", "line", "key", "problem"}`` (``check-config --json``)."""
        return {"file": self.file, "line": self.line, "key": self.key, "problem": self.problem}


class DuplicateKeyError(yaml.YAMLError):
    """A key written twice in one YAML mapping (YAML 1.2 forbids it; PyYAML silently keeps the
    last one, so a reviewed file could mean something else than it shows).

    Attributes:
        path: Key path of the repeated key.
        line: 1-based line of its second occurrence.
    """

    def __init__(self, path: KeyPath, line: int) -> None:
        super().__init__(f"line {line}: duplicate key {path[-1]!r}")
        self.path = path
        self.line = line


class InvalidConfig(ConfigError):
    """A :class:`ConfigError` with one :class:`ConfigProblem` per problem.

    ``message`` holds one line per problem (``str(problem)``), so every error boundary that
    prints ``message`` prints one line per problem.
    """

    def __init__(self, problems: Sequence[ConfigProblem]) -> None:
        if not problems:
            raise ValueError("InvalidConfig needs at least one problem")
        super().__init__("\n".join(str(p) for p in problems))
        self.problems: tuple[ConfigProblem, ...] = tuple(problems)


def _parse_dotted(key: str) -> KeyPath:
    return tuple(int(m[1]) if m[1] is not None else m[2] for m in _PART.finditer(key))


def compose_yaml(loader: yaml.SafeLoader) -> tuple[Any, dict[KeyPath, int]]:
    """Parse one YAML document with ``loader``, recording the line of every key and item.

    Args:
        loader: A (Safe)Loader constructed on the text; disposed here.

    Returns:
        ``(data, lines)``: the document as Python objects, and the 1-based line of every
        mapping key and sequence item by its key path (the document itself is ``()``).

    Raises:
        DuplicateKeyError: A key is repeated in one mapping.
        yaml.YAMLError: Not valid YAML.
    """
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        lines: dict[KeyPath, int] = {(): node.start_mark.line + 1}
        _walk(node, (), lines, set())
        return loader.construct_document(node), lines
    finally:
        loader.dispose()


def _walk(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int], active: set[int]) -> None:
    if id(node) in active:  # an alias that contains itself: construction reports it
        return
    active.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = (*path, str(key_node.value))
            if key_node.value in seen and key_node.tag != "tag:yaml.org,2002:merge":
                raise DuplicateKeyError(key, key_node.start_mark.line + 1)
            seen.add(key_node.value)
            lines.setdefault(key, key_node.start_mark.line + 1)
            _walk(value_node, key, lines, active)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.setdefault((*path, i), item.start_mark.line + 1)
            _walk(item, (*path, i), lines, active)
    active.discard(id(node))


def validation_problems(
    exc: ValidationError,
    *,
    prefix: KeyPath = (),
    file: str | None = None,
    lines: LineMap | None = None,
    model: type[BaseModel] | None = None,
) -> list[ConfigProblem]:
    """Turn a pydantic ``ValidationError`` into one :class:`ConfigProblem` per error.

    The one formatter of validation errors (gateway settings and every section).

    Args:
        exc: The validation error.
        prefix: Key path of the validated mapping inside the file (``("audit",)`` when the
            ``audit:`` section is validated alone).
        file: The config file, if any.
        lines: Key path -> line map of the file (:func:`compose_yaml`).
        model: The model that was validated: an unknown key (a typo) is then reported as
            ``unknown key (did you mean 'listen'?)`` or with the keys known there, instead of
            pydantic's ``Extra inputs are not permitted``.

    Returns:
        The problems in pydantic's order. A check that raises ``"key: problem"`` from a model
        validator (it knows a more precise key than the model) gets that key.
    """
    out: list[ConfigProblem] = []
    for err in exc.errors():
        path: KeyPath = (*prefix, *(p for p in err["loc"] if isinstance(p, str | int)))
        msg = _PREFIX.sub("", str(err["msg"]))
        if err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] == "extra_forbidden" and model is not None:
            msg = unknown_key(model, err["loc"]) or msg
        keyed = _KEYED.match(msg) if err["type"] == "value_error" else None
        if keyed is not None:
            path = (*path, *_parse_dotted(keyed[1]))
            msg = keyed[2]
        out.append(ConfigProblem(dotted(path), msg, file, line_of(lines, path)))
    return out


def problems_of(
    exc: ConfigError, *, file: str | None = None, lines: LineMap | None = None
) -> list[ConfigProblem]:
    """The problems of any :class:`ConfigError`, located in ``file`` where possible.

    An :class:`InvalidConfig` keeps its problems; another ``ConfigError`` (raised by a check on
    loaded settings: policy binding, TLS files, audit key files) gives one problem per line of
    its message, its ``key:`` prefix looked up in ``lines``.
    """
    if isinstance(exc, InvalidConfig):
        return list(exc.problems)
    out: list[ConfigProblem] = []
    for text in _split(exc.message):
        if file is not None:
            text = text.removeprefix(f"{file}: ")  # the file is named once, in front
        keyed = _KEYED.match(text)
        if keyed is None:
            out.append(ConfigProblem("(top level)", text, file, None))
            continue
        path = _parse_dotted(keyed[1])
        out.append(ConfigProblem(keyed[1], keyed[2], file, line_of(lines, path)))
    return out


def _split(message: str) -> Iterable[str]:
    return [line for line in message.splitlines() if line.strip()] or [message]
