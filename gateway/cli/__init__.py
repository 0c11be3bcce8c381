"""The ``gateway`` command: ``serve``, ``check-config``, ``keys`` (and ``audit`` when installed).

One error boundary (:func:`main`): a :class:`~gateway.errors.GatewayError` prints one line and
exits non-zero; ``--verbose`` shows the traceback. Exit codes: 0 ok, 1 verification failed
(invalid config), 2 usage or I/O error.
"""

from __future__ import annotations

import sys
import traceback
from typing import Annotated

import typer

from gateway.cli import check_config, keys, serve
from gateway.errors import GatewayError
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
def _root(
    ctx: typer.Context,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show tracebacks.")] = False,
) -> None:
    ctx.obj = {"verbose": verbose}


app.command("serve")(serve.serve)
app.command("check-config")(check_config.check_config)
app.add_typer(keys.app, name="keys")
app.add_typer(_preflight.app, name="preflight")

from gateway.cli import audit as _audit  # noqa: E402

app.add_typer(_audit.app, name="audit")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gateway`` console script; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    verbose = "--verbose" in args or "-v" in args
    try:
        app(args=args, prog_name="gateway")
    except SystemExit as exc:  # typer's standalone mode: usage errors (2), typer.Exit codes
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except GatewayError as exc:
        if verbose:
            traceback.print_exception(exc)
        print(f"gateway: error [{exc.code}]: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if verbose:
            traceback.print_exception(exc)
        print(f"gateway: unexpected error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
