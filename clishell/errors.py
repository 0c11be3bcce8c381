"""The one error line of every command line, and the exit statuses.

Every CLI of the project (``gateway``, ``policy``, ``weights``, ``airgap``) reports a failure as
one line on standard error::

    PROG: error [CODE]: WHAT, WHERE (hint: WHAT TO DO)

and a deprecated usage that still works as::

    PROG: warning [deprecated]: WHAT (hint: WHAT TO DO)

``CODE`` is the stable machine code of the package error (``config_error``, ``lockfile_invalid``,
``bundle_not_found``, ...), or one of the boundary's own: ``usage_error``, ``io_error``,
``interrupted``, ``internal_error``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "CliError",
    "error_line",
    "warn",
    "warning_line",
]

#: The command did what it was asked (and what it verified holds).
EXIT_OK = 0
#: A verification failed: digest, signature, policy or config did not hold.
EXIT_FAILED = 1
#: Usage error, bad input, or an I/O error (unreadable or unwritable file).
EXIT_USAGE = 2


def error_line(prog: str, code: str, message: str, hint: str | None = None) -> str:
    """``PROG: error [CODE]: MESSAGE (hint: HINT)``, on one line.

    Args:
        prog: The command's name (``gateway``, ``policy``, ``weights``, ``airgap``).
        code: The stable machine code of the error.
        message: What went wrong and where (file, line, key, option).
        hint: What to do about it, if there is advice to give.

    Returns:
        The line, without a newline; line breaks inside ``message`` become spaces.
    """
    text = f"{prog}: error [{code}]: {_one_line(message)}"
    return f"{text} (hint: {_one_line(hint)})" if hint else text


def warning_line(prog: str, code: str, message: str, hint: str | None = None) -> str:
    """``PROG: warning [CODE]: MESSAGE (hint: HINT)``, on one line (see :func:`error_line`)."""
    text = f"{prog}: warning [{code}]: {_one_line(message)}"
    return f"{text} (hint: {_one_line(hint)})" if hint else text


def warn(prog: str, code: str, message: str, hint: str | None = None) -> None:
    """Print :func:`warning_line` on standard error (the command carries on).

    Args:
        prog: The command's name.
        code: ``deprecated`` for an old form that still works, or another stable code.
        message: What was noticed.
        hint: What to do instead.
    """
    print(warning_line(prog, code, message, hint), file=sys.stderr, flush=True)


def _one_line(text: str) -> str:
    return " ".join(text.split("\n")) if "\n" in text else text


@dataclass(eq=False)
class CliError(Exception):
    """A failure the boundary prints as :func:`error_line` and exits with ``exit_code``.

    Commands raise it (``raise CliError(...) from exc``) for problems that are not a package
    error, and each CLI's ``describe`` function turns its package errors into one.

    Attributes:
        code: Stable machine code.
        message: What went wrong and where.
        hint: What to do, or None.
        exit_code: :data:`EXIT_FAILED` (verification failed) or :data:`EXIT_USAGE`.
        more: Further ``(code, message)`` problems of the same failure, one error line each
            (a verification that found several problems).
        document: The ``--json`` document printed on standard output instead of the default
            ``{"ok": false, "error": {"code", "message", "hint"}}``.
    """

    code: str
    message: str
    hint: str | None = None
    exit_code: int = EXIT_USAGE
    more: tuple[tuple[str, str], ...] = ()
    document: dict[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message
