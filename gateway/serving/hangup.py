"""SIGHUP held from the start of ``gateway serve`` until the live reload handles it.

A SIGHUP that reaches ``gateway serve`` before it serves would otherwise either end the process
(the default disposition: a pod restarted by a reload request) or be lost (ignored: the process
keeps serving the file it loaded, while the operator was told the new one applies). The
:class:`HangupLatch` is installed as the process's SIGHUP handler as soon as ``serve`` runs (and
first thing in each worker of ``--workers``); it only remembers that a SIGHUP came. Once the
server serves and :mod:`gateway.serving.reload` handles SIGHUP, :meth:`HangupLatch.take` tells
whether one
is owed, and one reload runs then.

The latch is the signal handler itself, so there is no module state: the process's signal table
is where it lives (:meth:`HangupLatch.install` finds it there).
"""

from __future__ import annotations

import signal
from types import FrameType

__all__ = ["HangupLatch"]


class HangupLatch:
    """A SIGHUP handler that records the signal for later (a reload once serving)."""

    def __init__(self) -> None:
        self.pending = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler: remember that a SIGHUP came."""
        self.pending = True

    def take(self) -> bool:
        """Whether a SIGHUP came since the latch was installed or last taken (and reset)."""
        pending, self.pending = self.pending, False
        return pending

    @classmethod
    def install(cls) -> HangupLatch:
        """The latch handling SIGHUP in this process, installed now if another handler was.

        Must be called in the main thread (as :func:`signal.signal`).

        Returns:
            The installed latch (the same object on every call while it handles SIGHUP).
        """
        current = signal.getsignal(signal.SIGHUP)
        if isinstance(current, HangupLatch):
            return current
        latch = cls()
        signal.signal(signal.SIGHUP, latch)
        return latch
