"""The ``gateway`` command: ``serve``, ``check-config``, ``keys``, ``preflight``, ``audit``,
``identity``.

The error boundary is the shared one (:func:`clishell.run`): a :class:`~gateway.errors.GatewayError`
(or any other failure) prints ``gateway: error [CODE]: WHAT (hint: ...)`` and exits non-zero;
``-v``/``--verbose`` shows the traceback, ``--version`` the version. Exit codes: 0 ok,
1 verification failed (invalid config, tampered audit log), 2 usage or I/O error.
"""

from __future__ import annotations

import sys

import typer

from clishell import CliError, VerboseOpt, VersionOpt, run
from gateway.cli import check_config, keys, serve
from gateway.errors import ConfigError
from gateway.preflight import cli as _preflight

__all__ = ["app", "main"]

app = typer.Typer(
    name="gateway",
    help="sovereign-gateway: OpenAI-compatible gateway in front of self-hosted vLLM.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(version: VersionOpt = False, verbose: VerboseOpt = False) -> None:
    """sovereign-gateway: OpenAI-compatible gateway in front of self-hosted vLLM."""


app.command("serve")(serve.serve)
app.command("check-config")(check_config.check_config)
app.add_typer(keys.app, name="keys")
app.add_typer(_preflight.app, name="preflight")

from gateway.cli import audit as _audit  # noqa: E402

app.add_typer(_audit.app, name="audit")

from gateway.cli import identity as _identity  # noqa: E402

app.add_typer(_identity.app, name="identity")


def _describe(exc: BaseException) -> CliError | None:
    """A configuration error with several problems (``serve`` of an invalid file): one error
    line per ``FILE:LINE: KEY: PROBLEM``, not one run-on line (the boundary joins the lines of
    a message)."""
    if not isinstance(exc, ConfigError):
        return None
    first, *rest = [line for line in exc.message.splitlines() if line.strip()] or [exc.message]
    if not rest:
        return None  # the boundary's own rendering
    return CliError(exc.code, first, more=tuple((exc.code, line) for line in rest))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gateway`` console script; returns the exit code."""
    return run(app, argv, prog="gateway", describe=_describe)


if __name__ == "__main__":
    sys.exit(main())
