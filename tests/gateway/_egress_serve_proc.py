"""Run ``gateway serve`` in this process, plus a probe thread (for the egress guard tests).

Usage: ``python _egress_serve_proc.py TRIGGER RESULT PORT -- <gateway args>``. Once the file
TRIGGER exists, the probe thread tries ``socket.create_connection(("127.0.0.1", PORT))`` from
inside the gateway process (a place no policy destination names) and writes what happened to
RESULT. No network is needed to start it: it polls the file system.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

from gateway.cli import main


def _probe(trigger: Path, result: Path, port: int) -> None:
    while not trigger.exists():
        time.sleep(0.05)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            outcome = "connected"
    except OSError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    # Written whole, then renamed: the test polls for the file and must never read it
    # between its creation and its write.
    partial = result.with_suffix(".partial")
    partial.write_text(outcome)
    partial.replace(result)


if __name__ == "__main__":
    trigger, result, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    threading.Thread(target=_probe, args=(trigger, result, port), daemon=True).start()
    sys.exit(main(sys.argv[5:]))
