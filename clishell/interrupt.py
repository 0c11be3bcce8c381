"""Turn SIGINT, SIGTERM and SIGHUP into an exception so that cleanup code runs.

Python's default SIGTERM/SIGHUP action kills the process without unwinding, and its SIGINT
becomes a ``KeyboardInterrupt`` that typer/click turn into an "abort" (``weights`` exited 0
with no output on Ctrl-C, so ``weights verify && deploy`` deployed): a command stopped by
Ctrl-C, ``kill``, ``systemd`` or a closed terminal must neither look successful nor leave a
half-written bundle, staging directory, key file or export behind. The CLI boundary
(:func:`clishell.run`, the ``main()`` of every command line) runs every command inside
:func:`interruptible`; there is no opt-out, so a command added later cannot read a Ctrl-C as
success either. Inside :func:`interruptible` these signals raise
:class:`Interrupted` (a ``BaseException``, so no ``except Exception`` swallows it), every
``finally``/``except BaseException`` on the way removes its partial output, and the CLI then
exits with the usual status (:func:`die_by`: 130 for Ctrl-C, 143 for SIGTERM), so a calling
shell, supervisor or ``subprocess`` never reads an interrupted command as a success.
A server that handles its own signals while it serves (uvicorn, ``gateway serve``'s drain)
replaces these handlers only while serving; when it ends because of SIGINT it raises
:class:`Interrupted` itself (``gateway serve``'s documented drain on SIGTERM still exits 0).
A signal that was ignored when we started stays ignored: ``nohup`` ignores SIGHUP, and a
shell starts background jobs (``cmd &``) with SIGINT ignored, so a Ctrl-C typed at the
terminal is not theirs. (Tests that send SIGINT to a child therefore reset the child's
disposition to the default before it starts.)
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: How often (seconds) a main thread that waits on another thread wakes up. CPython runs a
#: Python signal handler only in the main thread, between bytecodes or when a blocking call
#: returns EINTR; a signal the kernel gave to another thread, or whose C-level handler ran just
#: before the main thread began to wait, interrupts no wait. Waking this often bounds how long
#: its handler (the :class:`Interrupted` of a Ctrl-C) is late.
WAKE_S = 0.25


class Interrupted(BaseException):
    """A termination signal arrived; ``signum`` says which.

    Args:
        signum: The signal number.
        message: What the error line says instead of the default ("interrupted by SIG...;
            nothing half-written was left or made visible").
        hint: The error line's hint instead of the default ("rerun the command to resume").
    """

    def __init__(self, signum: int, message: str | None = None,
                 hint: str | None = None) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.message = message
        self.hint = hint

    @property
    def name(self) -> str:
        """The signal's name, e.g. ``SIGTERM``."""
        return signal.Signals(self.signum).name


@contextmanager
def interruptible() -> Iterator[None]:
    """Raise :class:`Interrupted` on SIGINT/SIGTERM/SIGHUP in the main thread while inside."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    previous = {}
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def wait_for(done: threading.Event, wake_s: float = WAKE_S) -> None:
    """Wait until ``done`` is set, waking every ``wake_s`` seconds to run signal handlers.

    An :class:`threading.Event`, not :meth:`threading.Thread.join`: on Python 3.11 a signal
    that interrupts ``join()`` can mark the thread stopped while it still runs (bpo-45274).

    Args:
        done: Set by the thread waited on when it ends.
        wake_s: See :data:`WAKE_S`.

    Raises:
        BaseException: What a signal handler raises meanwhile (:class:`Interrupted` inside
            :func:`interruptible`); ``done`` may then still be unset.
    """
    while not done.wait(wake_s):
        pass


def wait_out(done: threading.Event, alive: Callable[[], bool] = lambda: True) -> None:
    """Wait until ``done`` is set (or ``alive()`` turns false), whatever signal handlers raise
    meanwhile: the cleanup wait after a first interruption.

    Code that cleans up after a thread (removes the directory it writes into) must not go on
    while the thread still runs; a second Ctrl-C during that wait would cut it short if its
    :class:`Interrupted` propagated. The first interruption is the one the caller re-raises;
    what a later handler raises is dropped. The thread waited on must stop soon by itself.

    Args:
        done: Set by the thread when it ends.
        alive: False once the thread is known not to run (e.g. ``Thread.is_alive``: a thread
            whose start was interrupted before it ran never sets ``done``).
    """
    while alive() and not done.is_set():
        with contextlib.suppress(BaseException):  # see the docstring: a later signal
            done.wait(WAKE_S)


def die_by(signum: int) -> int:
    """The exit status of a command interrupted by ``signum``: ``128 + signum``.

    130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP: the shell convention for "stopped by a
    signal", returned as an ordinary exit status so that every caller (a shell, ``subprocess``,
    a CI runner) sees the same number. The caller returns it from ``main()``.

    Args:
        signum: The signal that interrupted the command.

    Returns:
        ``128 + signum``.
    """
    return 128 + signum
