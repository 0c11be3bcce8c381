"""The one error boundary of the project's command lines: :func:`run`.

Every console script's ``main()`` is ``return run(app, argv, prog=...)`` (plus what is its own:
a ``describe`` for package errors that need more than their code and message, a fast parser).
What :func:`run` does, the same for all:

* ``--version`` anywhere (before ``--``) prints ``PROG VERSION`` and exits 0;
  ``-v``/``--verbose`` anywhere shows the traceback of an error.
* Exit statuses: 0 ok; 1 verification failed; 2 usage error, bad input or I/O error;
  ``128 + signal`` when interrupted (130 SIGINT, 143 SIGTERM, 129 SIGHUP): every command runs
  inside :func:`clishell.interrupt.interruptible`, so cleanup runs and no interrupted command
  exits 0.
* Every failure is one line on standard error, :func:`clishell.errors.error_line`::

      PROG: error [CODE]: WHAT, WHERE (hint: WHAT TO DO)

  from, in this order: an interrupt (``interrupted``); a usage error of the parser
  (``usage_error``); :class:`~clishell.errors.CliError`; what ``describe`` makes of the
  exception; any exception with a string ``code`` attribute (the package error bases:
  ``message``, optional ``hint`` and ``exit_code``); :class:`OSError` (``io_error``); anything
  else (``internal_error``, a bug).
* With ``--json`` on the command line a failure also prints one JSON document on standard
  output, ``{"ok": false, "error": {"code", "message"[, "hint"]}}`` (or the error's own).
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from clishell import interrupt
from clishell.errors import EXIT_OK, EXIT_USAGE, CliError, error_line

if TYPE_CHECKING:
    import typer

# typer is imported only when a command goes through it (see invoke): a runner's fast path
# (`airgap verify`) runs without it. Its exceptions are recognised through sys.modules: if
# typer is not loaded, no exception can be one of its.

__all__ = ["BUG_HINT", "IO_HINT", "Describe", "Runner", "run", "shared_flags"]

#: ``describe(exc)``: a CLI's own reading of an exception, or None for the default.
Describe = Callable[[BaseException], CliError | None]
#: ``runner(args)``: run one command line (the shared flags removed); returns the exit status.
Runner = Callable[[list[str]], Any]

BUG_HINT = "this is a bug: rerun with --verbose and report the traceback"
IO_HINT = "check the path, its permissions and the free space of its file system"
_VERBOSE = ("-v", "--verbose")


def shared_flags(args: Sequence[str]) -> tuple[list[str], bool, bool]:
    """Take ``-v``/``--verbose`` and ``--version`` out of a command line, wherever they are.

    Tokens after ``--`` are operands and stay as they are.

    Args:
        args: The command line after the program name.

    Returns:
        (the other arguments, verbose given, version given).
    """
    rest: list[str] = []
    verbose = version = False
    for i, arg in enumerate(args):
        if arg == "--":
            rest.extend(args[i:])
            break
        if arg in _VERBOSE:
            verbose = True
        elif arg == "--version":
            version = True
        else:
            rest.append(arg)
    return rest, verbose, version


def run(
    app: typer.Typer | None,
    argv: Sequence[str] | None,
    *,
    prog: str,
    describe: Describe | None = None,
    runner: Runner | None = None,
    setup: Callable[[bool], None] | None = None,
) -> int:
    """Run one command line of ``app`` behind the shared error boundary.

    Args:
        app: The typer application (its help shows the shared options, see
            :mod:`clishell.options`); None when ``runner`` runs every command line.
        argv: The command line after the program name; None for ``sys.argv[1:]``.
        prog: The command's name, first word of every error line.
        describe: The CLI's own reading of some exceptions (e.g. several problems of one
            verification), consulted before the defaults.
        runner: Runs the arguments instead of ``app``'s click command (a fast path); it may
            fall back to :func:`invoke`.
        setup: Called with the verbose flag before the command runs (e.g. logging levels).

    Returns:
        The exit status (see the module docstring).
    """
    args, verbose, version = shared_flags(sys.argv[1:] if argv is None else argv)
    if version:
        from clishell.options import version_line

        print(version_line(prog), flush=True)
        return EXIT_OK
    if setup is not None:
        setup(verbose)
    as_json = "--json" in args
    try:
        # SIGINT/SIGTERM/SIGHUP raise Interrupted: cleanup runs, then exit 128 + signal.
        with interrupt.interruptible():
            if runner is not None:
                rc = runner(args)
            else:
                assert app is not None, "run() needs an app or a runner"
                rc = invoke(app, args, prog)
    except interrupt.Interrupted as exc:
        return _interrupted(prog, exc, as_json)
    except Exception as exc:
        typer = sys.modules.get("typer")
        if typer is not None and isinstance(exc, typer.Exit):
            return int(exc.exit_code)
        failure = _failure(exc, prog, describe)
        if failure is None:  # the parser's own help (no command given)
            return EXIT_USAGE
        _report(prog, failure, exc, verbose, as_json)
        return failure.exit_code
    return rc if isinstance(rc, int) else EXIT_OK


def invoke(app: typer.Typer, args: list[str], prog: str) -> Any:
    """Parse ``args`` with ``app``'s click command (help with command-line metavars) and run it.

    Returns:
        The command's return value, or the exit status of a ``typer.Exit``.

    Raises:
        Whatever the command raises, and click's usage errors (not shown: :func:`run` does).
    """
    from clishell.options import click_command

    return click_command(app).main(args=args, prog_name=prog, standalone_mode=False)


def _failure(exc: BaseException, prog: str, describe: Describe | None) -> CliError | None:
    if "typer" in sys.modules:
        parsed = _typer_failure(exc, prog)
        if parsed is not None:
            return None if parsed.code == "" else parsed
    if isinstance(exc, CliError):
        return exc
    if describe is not None:
        described = describe(exc)
        if described is not None:
            return described
    code = getattr(exc, "code", None)
    if isinstance(code, str) and code:
        exit_code = getattr(exc, "exit_code", EXIT_USAGE)
        return CliError(code, str(getattr(exc, "message", exc)), hint=getattr(exc, "hint", None),
                        exit_code=exit_code if isinstance(exit_code, int) else EXIT_USAGE)
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return CliError("io_error", f"{where}{exc.strerror or exc}", hint=IO_HINT)
    return CliError("internal_error", f"unexpected {type(exc).__name__}: {exc}", hint=BUG_HINT)


def _typer_failure(exc: BaseException, prog: str) -> CliError | None:
    """A usage error of typer's parser (its vendored click); code "" for "help was shown"."""
    import typer
    from typer._click import exceptions as click_exc

    if isinstance(exc, click_exc.NoArgsIsHelpError):
        exc.show()
        return CliError("", "")
    if isinstance(exc, click_exc.ClickException):
        ctx = getattr(exc, "ctx", None)
        where = ctx.command_path if ctx is not None else prog
        return CliError("usage_error", exc.format_message(), hint=f"see '{where} --help'",
                        exit_code=exc.exit_code if exc.exit_code > 1 else EXIT_USAGE)
    if isinstance(exc, typer.Abort):
        return CliError("aborted", "aborted (end of input)", exit_code=EXIT_USAGE)
    return None


def _report(prog: str, failure: CliError, exc: BaseException, verbose: bool,
            as_json: bool) -> None:
    if as_json and failure.document != {}:
        doc = failure.document
        if doc is None:
            error = {"code": failure.code, "message": failure.message}
            doc = {"ok": False, "error": error | ({"hint": failure.hint} if failure.hint else {})}
        sys.stdout.write(_json_text(doc) + "\n")
        sys.stdout.flush()
    if verbose:
        traceback.print_exception(exc)
    lines = [error_line(prog, failure.code, failure.message, failure.hint)]
    lines += [error_line(prog, code, message) for code, message in failure.more]
    print("\n".join(lines), file=sys.stderr, flush=True)


def _json_text(doc: dict[str, Any]) -> str:
    """JSON that is valid UTF-8 even when a file name kept undecodable bytes as surrogates."""
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(doc, indent=2)
    return text


def _interrupted(prog: str, exc: interrupt.Interrupted, as_json: bool) -> int:
    message = exc.message or (f"interrupted by {exc.name}; nothing half-written was left or "
                              "made visible")
    if as_json:
        doc = {"ok": False, "interrupted": True, "signal": exc.name,
               "error": {"code": "interrupted", "message": message}}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        sys.stdout.flush()
    print(error_line(prog, "interrupted", message, exc.hint or "rerun the command to resume"),
          file=sys.stderr, flush=True)
    return interrupt.die_by(exc.signum)
