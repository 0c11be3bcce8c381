"""Input files read so that a signal arriving while the read waits is never lost.

An operator may hand a command a pipe instead of a file: ``gateway serve --config <(envsubst <
gateway.yaml.tpl)``, ``airgap pack --key <(vault kv get ...)``, a named FIFO, ``/dev/stdin``.
Reading one waits until its writer writes or closes, for as long as it takes. CPython runs a
Python signal handler (the :class:`~clishell.interrupt.Interrupted` of a Ctrl-C) only in the
main thread, between bytecodes or when a blocking system call returns ``EINTR``; a signal whose
C-level handler runs just before the main thread enters ``read(2)`` interrupts nothing, and
the read then waits for its writer for ever: the Ctrl-C is lost and the command hangs (seen: 1
``gateway serve`` in 120 under load, blocked in ``anon_pipe_read`` after its SIGINT).

:func:`read_input` reads a regular file at once (a read of one cannot wait for a writer) and
anything else (FIFO, pipe, character device, socket) in a daemon thread, while the calling
main thread waits for it with :func:`~clishell.interrupt.wait_for`, waking every
:data:`~clishell.interrupt.WAKE_S`: a pending handler then runs within that time of its
signal, whichever thread the kernel delivered it to. When the handler raises, the reader thread
is left blocked and ends with the process.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

from clishell.interrupt import WAKE_S, wait_for

__all__ = ["not_regular", "read_input", "read_input_text"]


def read_input(path: Path | str, *, wake_s: float = WAKE_S) -> bytes:
    """The whole content of the file at ``path``, as :meth:`pathlib.Path.read_bytes` gives it.

    Args:
        path: The file; a FIFO, pipe or device is read until its writer closes it.
        wake_s: How often, in seconds, the main thread wakes while it waits for a pipe's
            reader thread, to run pending signal handlers.

    Returns:
        The bytes read.

    Raises:
        OSError: The file cannot be opened or read (as ``Path.read_bytes`` raises it).
        BaseException: Whatever a signal handler raises while the read waits
            (:class:`~clishell.interrupt.Interrupted` inside :func:`~clishell.interruptible`).
    """
    path = Path(path)
    if threading.current_thread() is not threading.main_thread() or not not_regular(path):
        # Only the main thread runs handlers; a regular file never waits for a writer; a
        # missing file or a directory fails at once, with the error a plain read gives.
        return path.read_bytes()
    outcome: list[bytes | BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            outcome.append(path.read_bytes())
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=read, name=f"read {path}", daemon=True).start()
    wait_for(done, wake_s)  # a pending handler runs at each wake-up
    (result,) = outcome
    if isinstance(result, BaseException):
        raise result
    return result


def read_input_text(path: Path | str, *, encoding: str = "utf-8",
                    wake_s: float = WAKE_S) -> str:
    """The text of the file at ``path``, as :meth:`pathlib.Path.read_text` gives it.

    Line ends are translated as text mode does (``\\r\\n`` and ``\\r`` become ``\\n``), so a
    caller that used ``read_text`` sees the same text.

    Args:
        path: The file (see :func:`read_input`).
        encoding: The text encoding (strict).
        wake_s: See :func:`read_input`.

    Returns:
        The decoded text.

    Raises:
        OSError: The file cannot be opened or read.
        UnicodeDecodeError: The bytes are not ``encoding``; ``start`` is the byte offset in
            the file.
        BaseException: What a signal handler raises meanwhile (see :func:`read_input`).
    """
    text = read_input(path, wake_s=wake_s).decode(encoding)
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def not_regular(path: Path | str) -> bool:
    """Whether ``path`` names something a read may wait on: a FIFO, pipe, device or socket.

    For a consumer that reads a file by name more than once (the TLS layer, a signing library,
    a live reload): a pipe's content is its writer's, once, and a second read waits for a writer
    that never comes. Links are followed (a Kubernetes Secret's file is a link to a regular
    file).

    Returns:
        False for a regular file, a directory, or nothing at ``path`` (the read then fails at
        once and says so).
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))
