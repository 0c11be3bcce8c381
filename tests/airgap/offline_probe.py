"""Run a Python entry point with every socket use recorded and blocked (``sys.addaudithook``).

Usage: ``python offline_probe.py REPORT.json module:function [args...]`` - calls
``function(args)`` (a CLI ``main(argv)``), or with ``-c CODE`` executes CODE; then writes
``{"rc": ..., "events": [...]}`` to REPORT.json. Any ``socket.connect``, ``socket.getaddrinfo``,
``socket.gethostbyname`` or ``socket.bind`` raises, so a hidden connection also fails loudly.
"""

from __future__ import annotations

import importlib
import json
import sys

EVENTS = ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.bind",
          "socket.sendto", "socket.sendmsg")  # fmt: skip


def main() -> None:
    report, target, *args = sys.argv[1:]
    seen: list[list[str]] = []

    def hook(event: str, hook_args: tuple[object, ...]) -> None:
        if event in EVENTS:
            seen.append([event, repr(hook_args)[:200]])
            raise OSError(f"network use blocked by test: {event}")

    sys.addaudithook(hook)
    rc: object = None
    try:
        if target == "-c":
            exec(compile(args[0], "<probe>", "exec"), {"__name__": "__probe__"})  # noqa: S102
            rc = 0
        else:
            module, func = target.split(":")
            rc = getattr(importlib.import_module(module), func)(args)
    finally:
        with open(report, "w", encoding="utf-8") as fh:
            json.dump({"rc": rc, "events": seen}, fh)


if __name__ == "__main__":
    main()
