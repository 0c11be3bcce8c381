"""Turn SIGINT, SIGTERM and SIGHUP into an exception so that cleanup code runs.

Python's default SIGTERM/SIGHUP action kills the process without unwinding: a ``pack`` or
``unpack`` stopped by ``kill``, ``systemd`` or a closed terminal would leave its temporary
bundle or staging directory behind. Inside :func:`interruptible` these signals raise
:class:`Interrupted` (a ``BaseException``, so no ``except Exception`` swallows it), every
``finally``/``except BaseException`` on the way removes its partial output, and the CLI then
ends the process by the same signal (:func:`die_by`), so a calling shell or supervisor sees
the usual status (130 for Ctrl-C, 143 for SIGTERM) and stops a loop as it would for any tool.
A signal that was ignored when we started (``nohup``, background jobs) stays ignored.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """A termination signal arrived; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum

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


def die_by(signum: int) -> int:
    """End the process by ``signum`` with its default action; returns 128 + signum if the
    process survives it (a signal whose default is not to terminate)."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return 128 + signum
