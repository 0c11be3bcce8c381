"""``airgap`` command line: keygen, pack, verify, unpack, inspect, oci-export, oci-verify.

Each command parses, calls the public API and renders. ``main()`` is the shared error boundary
(:func:`clishell.run`): exit 0 ok, 1 verification failed (bundle, signature or content not
trusted), 2 usage or I/O, 128 + signal when interrupted; ``-v``/``--verbose`` shows tracebacks.

Start-up cost matters for ``airgap verify`` (docs/airgap.md, "Measured performance"): this
module holds the entry point, :mod:`airgap.cli_verify` the rendering helpers and ``verify``'s
implementation, and neither imports typer or rich; a plain ``verify`` command line is parsed here
(:func:`_fast_verify_args`), everything else goes to the typer application in
:mod:`airgap.cli_app` (``airgap.cli.app``). pack, unpack, the ML-BOM writer and the private-key
code load only in the commands that use them, and rich is imported on first use
(:mod:`clishell.consoles`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airgap.cli_verify import problem_text, run_verify
from airgap.errors import AirgapError, VerificationFailed
from airgap.verify import MAX_SHOWN_PROBLEMS, problems_json
from clishell import EXIT_FAILED, CliError, invoke, run
from clishell.text import escaped

#: `airgap verify` options the fast parser takes: option -> (parameter, takes a value,
#: repeatable). Kept equal to the typer command's by tests/airgap/test_cli_startup.py.
_VERIFY_OPTIONS: dict[str, tuple[str, bool, bool]] = {
    "--public-key": ("public_key", True, True),
    "-k": ("public_key", True, True),
    "--lock": ("expected_lock", True, False),
    "--all-parts": ("all_parts", False, False),
    "--json": ("as_json", False, False),
    "--workers": ("workers", True, False),
    "--quiet": ("quiet", False, False),
    "-q": ("quiet", False, False),
}


def _fast_verify_args(args: Sequence[str]) -> dict[str, Any] | None:
    """Keyword arguments of ``verify`` for a plain, well-formed ``verify`` command line.

    typer's parser builds a pydantic TypeAdapter per parameter on first use, which costs about
    0.25 CPU-s of start-up (pydantic's import) on every ``airgap verify``, and importing typer
    itself about 0.15 CPU-s more. This parser takes
    only the unambiguous forms (``--opt VALUE``, ``--opt=VALUE``, ``-k VALUE``, flags, one
    bundle argument) and returns None for anything else (help, unknown or repeated options,
    ``--``, bundled short flags, a bad number, a missing key), which then goes through typer
    as before, so every error message and exit code stays typer's.

    Args:
        args: The command line after the program name, ``--verbose`` already removed.

    Returns:
        The keyword arguments for :func:`run_verify`, or None to let typer parse.
    """
    if not args or args[0] != "verify":
        return None
    kwargs: dict[str, Any] = {"public_key": [], "expected_lock": None, "all_parts": False,
                              "as_json": False, "workers": 0, "quiet": False}
    bundle: Path | None = None
    seen: set[str] = set()
    rest = list(args[1:])
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("-") and arg:
            if bundle is not None:
                return None
            bundle = Path(arg)
            continue
        name, eq, inline = arg.partition("=")
        spec = _VERIFY_OPTIONS.get(name)
        if spec is None or (eq and (not spec[1] or not name.startswith("--"))):
            return None
        param, takes_value, repeatable = spec
        if param in seen and not repeatable:
            return None
        seen.add(param)
        if not takes_value:
            kwargs[param] = True
            continue
        if eq:
            value = inline
        elif rest and not rest[0].startswith("-"):
            value = rest.pop(0)
        else:
            return None
        if not value:
            return None
        if param == "workers":
            if not value.isascii() or not value.isdigit():
                return None
            kwargs[param] = int(value)
        elif param == "public_key":
            kwargs[param].append(Path(value))
        else:
            kwargs[param] = Path(value)
    if bundle is None or not kwargs["public_key"]:
        return None
    kwargs["bundle"] = bundle
    return kwargs


def _run(args: list[str]) -> Any:
    """Run one command: ``verify`` through the fast parser when it can (typer is then never
    imported), else through the typer application."""
    fast = _fast_verify_args(args)
    if fast is None:
        from airgap.cli_app import app

        return invoke(app, args, "airgap")
    return run_verify(**fast)


def _describe(exc: BaseException) -> CliError | None:
    """A bundle that is not trusted: one error line per problem (the first
    ``MAX_SHOWN_PROBLEMS``), exit 1, and the problems in the ``--json`` document. Any other
    package error: its line, with every control or bidirectional character of its message
    escaped (a message can carry a name from the bundle, the media or the store)."""
    if isinstance(exc, AirgapError) and not isinstance(exc, VerificationFailed):
        return CliError(exc.code, escaped(exc.message), exit_code=exc.exit_code,
                        hint=None if exc.hint is None else escaped(exc.hint))
    if not isinstance(exc, VerificationFailed):
        return None
    shown = [(p.code, problem_text(p)) for p in exc.problems[:MAX_SHOWN_PROBLEMS]]
    omitted = len(exc.problems) - len(shown)
    if omitted:
        shown.append(("verification_failed", f"... and {omitted} more problem(s) "
                      f"({len(exc.problems)} in all; fix these first)"))
    (code, message), *more = shown
    return CliError(code, message, exit_code=EXIT_FAILED, more=tuple(more),
                    document={"ok": False, **problems_json(exc.problems)})


def main(argv: list[str] | None = None) -> int:
    """Entry point: the shared CLI boundary (:func:`clishell.run`); returns the exit code."""
    return run(None, argv, prog="airgap", describe=_describe, runner=_run)


def __getattr__(name: str) -> Any:
    """``airgap.cli.app``: the typer application, imported on first use."""
    if name == "app":
        from airgap.cli_app import app

        return app
    raise AttributeError(f"module 'airgap.cli' has no attribute {name!r}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
