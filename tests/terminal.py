"""Run a command line as an operator does: on a real pseudo-terminal, or piped.

``on_terminal(argv, columns=80)`` starts ``argv`` with standard input, output and error all on
the secondary side of a fresh pseudo-terminal whose window size is set with ``TIOCSWINSZ`` (as a
terminal emulator does; ``COLUMNS``/``LINES`` are removed from the environment so the program
must ask the terminal), reads the primary side until the program exits, and returns what the
terminal showed. ``piped(argv)`` runs it with standard output and error on two pipes.

``visible_lines(text)`` strips the terminal control sequences (colour, cursor moves, the progress
bar's redraws) and returns the lines as a reader would see them.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import termios
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# CSI sequences (colour, cursor), OSC sequences (titles, hyperlinks), and lone escapes.
_CONTROL = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]")


@dataclass(frozen=True)
class TerminalRun:
    """What a program showed on a terminal.

    Attributes:
        returncode: Exit status.
        screen: Everything written to the terminal (control sequences kept).
    """

    returncode: int
    screen: str


@dataclass(frozen=True)
class PipedRun:
    """What a program wrote to its two pipes.

    Attributes:
        returncode: Exit status.
        stdout: Standard output.
        stderr: Standard error.
    """

    returncode: int
    stdout: str
    stderr: str


def _env(extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE",
                        "TTY_INTERACTIVE", "TERM")}
    env.update(PYTHONPATH=str(ROOT), TERM="xterm-256color")
    env.update(extra or {})
    return env


def on_terminal(argv: list[str], *, columns: int = 80, rows: int = 24,
                cwd: Path | None = None, env: dict[str, str] | None = None,
                timeout_s: float = 120.0) -> TerminalRun:
    """Run ``argv`` on a pseudo-terminal of ``columns`` x ``rows`` cells.

    Raises:
        AssertionError: The program did not exit within ``timeout_s`` seconds (it is killed).
    """
    primary, secondary = os.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(argv, stdin=secondary, stdout=secondary, stderr=secondary,
                            cwd=cwd or ROOT, env=_env(env), start_new_session=True)
    os.close(secondary)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise AssertionError(f"{argv} still running after {timeout_s} s: "
                                     f"{b''.join(chunks)[-2000:]!r}")
            ready, _, _ = select.select([primary], [], [], 0.2)
            if not ready:
                if proc.poll() is not None:
                    # Nothing left to read once the program has gone and the buffer is empty.
                    ready, _, _ = select.select([primary], [], [], 0)
                    if not ready:
                        break
                continue
            try:
                data = os.read(primary, 65536)
            except OSError:  # EIO: every secondary descriptor closed
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(primary)
    proc.wait()
    return TerminalRun(proc.returncode, b"".join(chunks).decode("utf-8", "replace"))


def piped(argv: list[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
          timeout_s: float = 120.0) -> PipedRun:
    """Run ``argv`` with standard output and standard error on pipes (as ``cmd > file``)."""
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          cwd=cwd or ROOT, env=_env(env), timeout=timeout_s, check=False)
    return PipedRun(proc.returncode, proc.stdout, proc.stderr)


def visible_lines(screen: str) -> list[str]:
    """The lines a reader sees: control sequences removed, carriage-return redraws resolved
    to their last state, trailing blanks dropped."""
    lines = []
    for raw in _CONTROL.sub("", screen).replace("\r\n", "\n").split("\n"):
        line = raw.split("\r")[-1] if raw.rstrip("\r") else ""
        lines.append(line.rstrip())
    return lines
