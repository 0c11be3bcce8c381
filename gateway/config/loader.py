"""Loading the gateway configuration: YAML file and environment -> validated, frozen
:class:`~gateway.config.settings.GatewaySettings`.

:func:`load` reads the file (a regular file, or standard input), :func:`parse` validates a
mapping: secrets are resolved from the ``environ`` mapping it is given (never ``os.environ``
at import), a ``keys_file`` is merged, replicas that name only a policy destination get its
URL, every problem is reported as ``file:line: key: problem`` (:mod:`gateway.config.errors`),
and every relative path of every section is resolved against the config file's directory in
one place (:func:`_resolve_paths`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
)

from clishell import not_regular, read_input_text
from gateway.config.base import ENV_NAME
from gateway.config.errors import (
    ConfigProblem,
    DuplicateKeyError,
    InvalidConfig,
    KeyPath,
    LineMap,
    compose_yaml,
    dotted,
    line_of,
    validation_problems,
)
from gateway.config.keys_file import merge_keys_file, relabel_keys
from gateway.config.override_names import OverrideNames, unmatched_overrides
from gateway.config.replica_urls import fill_replica_urls
from gateway.config.settings import GatewaySettings
from gateway.errors import ConfigError

__all__ = ["load", "parse"]

_M = TypeVar("_M", bound=BaseModel)


def _under(base: Path, value: str | Path) -> Path:
    """``value`` relative to ``base`` (the config file's directory) unless absolute."""
    path = Path(value)
    return path if path.is_absolute() else base / path


def _resolve_secrets(
    data: dict[str, Any], environ: Mapping[str, str], base: Path, *, read: bool = True
) -> list[tuple[KeyPath, str]]:
    """Fill ``api_key`` of each replica from its ``api_key_env`` / ``api_key_file`` (with
    ``read=False`` only refuse an inline ``api_key``).

    Returns:
        ``(key path, problem)`` per secret that could not be resolved (empty when all were).
    """
    problems: list[tuple[KeyPath, str]] = []
    for i, model in enumerate(data.get("models") or []):
        if not isinstance(model, dict):
            continue
        for j, replica in enumerate(model.get("replicas") or []):
            if not isinstance(replica, dict):
                continue
            where: KeyPath = ("models", i, "replicas", j)
            if "api_key" in replica:
                problems.append(((*where, "api_key"), "secrets do not belong in the file; "
                                 "use api_key_env or api_key_file"))
                del replica["api_key"]
                continue
            if not read:
                continue
            env_name = replica.get("api_key_env")
            file_name = replica.get("api_key_file")
            if isinstance(env_name, str) and ENV_NAME.match(env_name):
                value = environ.get(env_name)
                if not value:
                    problems.append(((*where, "api_key_env"),
                                     f"environment variable {env_name} is not set"))
                    continue
                replica["api_key"] = value
            elif isinstance(file_name, str):
                path = _under(base, file_name)
                try:
                    value = read_input_text(path).strip()
                except OSError as exc:
                    problems.append(((*where, "api_key_file"),
                                     f"cannot read {path}: {exc.strerror}"))
                    continue
                if not value:
                    problems.append(((*where, "api_key_file"), f"{path} is empty"))
                    continue
                replica["api_key"] = value
    return problems


def parse(
    data: Any,
    environ: Mapping[str, str] | None = None,
    base: Path | None = None,
    *,
    file: str | None = None,
    lines: LineMap | None = None,
    secrets: bool = True,
    tolerate: OverrideNames | None = None,
) -> GatewaySettings:
    """Validate an already-parsed config mapping.

    Args:
        data: The YAML document as Python objects.
        environ: Where ``api_key_env`` names are looked up (default: empty mapping).
        base: Directory every relative path of the config is resolved against (:func:`load`
            passes the config file's). Without it, relative paths stay relative (to the current
            directory, where ``api_key_file`` and ``keys_file`` are read). ``keys_file`` (a YAML
            list shaped like ``keys``) is merged after the inline ``keys``
            (see :mod:`gateway.config.keys_file`).
        file: The config file the data came from (named in each problem).
        lines: Key path -> 1-based line of ``file`` (:func:`gateway.config.errors.compose_yaml`).
        secrets: Read the replicas' backend keys (``api_key_env``/``api_key_file``). A command
            that needs none of them (``gateway keys``) passes ``False``: their ``api_key`` stays
            ``None`` and an unset variable is no problem.
        tolerate: A live reload's names of the running configuration: an override naming no
            key but one of these is a warning (:attr:`GatewaySettings.warnings`), not a
            problem (:mod:`gateway.config.override_names`). ``None`` (start, check-config): every
            override naming no key is refused.

    Returns:
        The frozen settings, every section validated (and, with ``base``, every relative path
        made absolute).

    Raises:
        InvalidConfig: One problem per offending key (``file:line: key: problem``).
    """
    if not isinstance(data, dict):
        raise InvalidConfig([ConfigProblem("(top level)", "the config must be a YAML mapping",
                                           file, 1 if file else None)])
    data = _deep_copy(data)
    here = base.absolute() if base is not None else Path.cwd()
    unfilled = fill_replica_urls(data, here)
    # A replica whose url the policy could not supply is reported once, not also as "missing".
    unfilled_at = {dotted(path[:-1]) for path, _ in unfilled}
    problems = [ConfigProblem(dotted(path), msg, file, line_of(lines, path))
                for path, msg in (*_resolve_secrets(data, environ or {}, here, read=secrets),
                                  *unfilled)]
    key_labels, key_problems = merge_keys_file(data, here)
    keys_file_line = line_of(lines, ("keys_file",))
    for text in key_problems:
        key, _, msg = text.partition(": ")
        problems.append(ConfigProblem(key, msg, file, keys_file_line))
    try:
        settings = GatewaySettings(**data)
    except ValidationError as exc:
        found = [_relabel(p, key_labels, keys_file_line)
                 for p in validation_problems(exc, file=file, lines=lines,
                                              model=GatewaySettings)
                 if not (p.key.endswith(".url") and p.key.removesuffix(".url") in unfilled_at)]
        raise InvalidConfig([*found, *problems]) from exc
    warnings: list[ConfigProblem] = []
    secrets_now = {k.sha256 for k in settings.keys}
    for unmatched in unmatched_overrides(settings):
        tolerated = tolerate is not None and tolerate.tolerates(unmatched, secrets_now)
        (warnings if tolerated else problems).append(ConfigProblem(
            dotted(unmatched.path), unmatched.warning() if tolerated else unmatched.refusal(),
            file, line_of(lines, unmatched.path)))
    if problems:
        raise InvalidConfig(problems)
    if base is not None:
        settings = _resolve_paths(settings, here)
        if settings.audit is not None:  # its store URL too (a relative sqlite:// file)
            settings = settings.model_copy(update={"audit": settings.audit.under(here)})
    settings._source = (file, lines)
    settings._warnings = tuple(warnings)
    return settings


def _relabel(
    problem: ConfigProblem, labels: list[str], keys_file_line: int | None
) -> ConfigProblem:
    """Name where a merged ``keys[i]`` came from (inline ``keys[i]`` or ``keys_file (...)[j]``);
    an entry of the keys file is reported on the config's ``keys_file:`` line."""
    key = relabel_keys(problem.key, labels)
    if key == problem.key:
        return problem
    line = keys_file_line if key.startswith("keys_file") else problem.line
    return ConfigProblem(key, relabel_keys(problem.problem, labels), problem.file, line)


def load(
    path: Path | str, environ: Mapping[str, str] | None = None, *, secrets: bool = True,
    tolerate: OverrideNames | None = None,
) -> GatewaySettings:
    """Read and validate the YAML config file at ``path`` (``secrets``, ``tolerate``: see
    :func:`parse`).

    Raises:
        ConfigError: The file cannot be read.
        InvalidConfig: The file is not YAML, or is invalid: one ``file:line: key: problem``
            per problem, e.g. ``gw.yaml:7: models[0].replicas[1].url: must be an http://
            or https:// URL``.
    """
    path = Path(path)
    file = str(path)
    try:
        text = read_input_text(path)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc

    def fail(key: str, problem: str, line: int | None) -> InvalidConfig:
        return InvalidConfig([ConfigProblem(key, problem, file, line)])

    try:
        data, lines = compose_yaml(yaml.SafeLoader(text))
    except DuplicateKeyError as exc:
        raise fail(dotted(exc.path), f"duplicate key {exc.path[-1]!r}", exc.line) from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise fail("(top level)", f"not valid YAML: {exc.problem}",
                   mark.line + 1 if mark is not None else None) from exc
    except yaml.YAMLError as exc:
        raise fail("(top level)", f"not valid YAML: {exc}", None) from exc
    except RecursionError as exc:
        raise fail("(top level)", "the YAML refers to itself or nests too deeply", None) from exc
    try:
        # A config given as a pipe (<(envsubst < gw.yaml), /dev/stdin) has no directory of its
        # own: its relative paths are the operator's, relative to where the command runs.
        base = Path.cwd() if not_regular(path) else path.parent
        return parse(data, environ, base, file=file, lines=lines, secrets=secrets,
                     tolerate=tolerate)
    except RecursionError as exc:
        raise fail("(top level)", "the YAML refers to itself or nests too deeply", None) from exc


def _resolve_paths(model: _M, base: Path) -> _M:
    """Return ``model`` with every relative :class:`~pathlib.Path` in it (any section, any
    depth, in lists and mappings) made relative to ``base``, the config file's directory.

    The one place relative paths are resolved: a new ``Path`` field of any section is covered
    without being listed. URLs (``audit.store: sqlite:///PATH``) are strings and keep their
    documented meaning, except a relative ``audit.store: sqlite://FILE``, which
    :meth:`AuditSettings.under` resolves the same way.
    """
    updates: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        resolved = _resolved(value, base)
        if resolved is not value:
            updates[name] = resolved
    return model.model_copy(update=updates) if updates else model


def _resolved(value: Any, base: Path) -> Any:
    if isinstance(value, Path):
        return value if value.is_absolute() else base / value
    if isinstance(value, BaseModel):
        return _resolve_paths(value, base)
    if isinstance(value, list):
        items = [_resolved(v, base) for v in value]
        return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
    if isinstance(value, dict):
        entries = {k: _resolved(v, base) for k, v in value.items()}
        return entries if any(entries[k] is not value[k] for k in value) else value
    return value


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
