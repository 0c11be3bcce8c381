"""The options every CLI shares (``--version``, ``-v/--verbose``) and help without type names.

typer (0.29) renders a parameter's Python annotation in the help (``<str>``, ``<list[Path]>``,
``<bool>`` for a flag and ``--help``, ``{path} <path>`` for an argument); :func:`click_command`
sets the command-line conventions instead (``TEXT``, ``PATH``, nothing for a flag, the
argument's name in capitals) once, on the click command tree that the boundary then runs:
explicit metavars on the parameters, and two instance overrides of typer's rendering (the
argument's type column, the ``--help`` option click creates at parse time).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import typer
import typer.main

__all__ = ["CONFIG_ENV", "VERSION", "ConfigOpt", "VerboseOpt", "VersionOpt", "click_command",
           "require_config", "version_line"]

#: The version of the project's command lines (``pyproject.toml`` ``[project] version``; a test
#: holds them equal). A constant, not package metadata: the container image runs the packages
#: as plain source, without installed metadata.
VERSION = "0.1.0"


def version_line(prog: str) -> str:
    """``PROG VERSION``, what ``--version`` prints on standard output."""
    return f"{prog} {VERSION}"


def _show_version(ctx: typer.Context, value: bool) -> None:
    if value:
        typer.echo(version_line(ctx.find_root().info_name or "sovereign-gateway"))
        raise typer.Exit()


VersionOpt = Annotated[bool, typer.Option(
    "--version", callback=_show_version, is_eager=True, expose_value=True,
    help="Show the version and exit (any position).")]
VerboseOpt = Annotated[bool, typer.Option(
    "--verbose", "-v", help="Show the traceback of an error (any position).")]

#: The environment variable every ``--config`` reads when the option is not given.
CONFIG_ENV = "SG_CONFIG"

#: ``--config FILE`` / ``-c FILE`` / ``$SG_CONFIG``: the gateway's YAML configuration, taken the
#: same way by every command that reads it (``gateway serve``, ``check-config``, ``preflight``,
#: ``audit``, ``keys``; ``policy explain``). ``None`` when neither is given: a command that needs
#: the file calls :func:`require_config`.
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", "-c", envvar=CONFIG_ENV, show_default=False,
    help="Gateway YAML config file (or the SG_CONFIG environment variable).")]


def require_config(config: Path | None) -> Path:
    """The ``--config`` file of a command that cannot run without one.

    Raises:
        CliError: Neither ``--config`` nor ``SG_CONFIG`` given (``usage_error``, exit 2).
    """
    if config is None:
        from clishell.errors import CliError

        raise CliError("usage_error", "no config file given",
                       hint=f"pass --config FILE (or set {CONFIG_ENV})")
    return config


_TYPE_METAVARS = {str: "TEXT", int: "INTEGER", float: "FLOAT", bool: "BOOLEAN", Path: "PATH"}


def _metavar(param: Any) -> str:
    """The help metavar of one typer parameter (the conventions of click's own help)."""
    if param.param_type_name == "argument":
        return str(param.name).upper()
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    kind = param.type_descriptor
    if kind.is_choice:
        return "[" + "|".join(str(getattr(c, "value", c)) for c in kind.choices or ()) + "]"
    if kind.is_path:
        return "PATH"
    annotation = kind.annotation
    if get_origin(annotation) is list:
        (annotation,) = get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "[" + "|".join(str(m.value) for m in annotation) + "]"
    return _TYPE_METAVARS.get(annotation, "VALUE")


def _no_type(ctx: Any) -> None:
    return None


def _usage_pieces(param: Any) -> Callable[[Any], list[str]]:
    def pieces(ctx: Any) -> list[str]:  # click's convention: NAME required, [NAME] optional
        shown = param.metavar if param.required else f"[{param.metavar}]"
        return [shown + ("..." if param.nargs != 1 else "")]  # typer wrote {NAME}
    return pieces


def _tidy(command: Any) -> None:
    # Plain click help (typer's public rich_markup_mode=None): it wraps every column at the
    # terminal's width and rewraps docstring paragraphs; typer's rich panels cut a long option
    # name or choice list with an ellipsis at 80 columns (--gpu-memory-utilizati...).
    command.rich_markup_mode = None
    for param in command.params:
        if param.metavar is None:
            param.metavar = _metavar(param)
        if param.param_type_name == "argument":  # its name (metavar) says it; no <type> after
            param.display_type_rich = _no_type
            param.get_usage_pieces = _usage_pieces(param)
    get_help_option = command.get_help_option

    def help_option(ctx: Any) -> Any:  # click adds --help at parse time: a flag, no <bool>
        option = get_help_option(ctx)
        if option is not None and option.metavar is None:
            option.metavar = ""
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():
        _tidy(sub)


def click_command(app: typer.Typer) -> Any:
    """The click command tree of ``app`` with command-line metavars in its help.

    Args:
        app: The typer application.

    Returns:
        The click group (or command) to run with ``.main(args=..., prog_name=...,
        standalone_mode=False)``.
    """
    command = typer.main.get_command(app)
    _tidy(command)
    return command
