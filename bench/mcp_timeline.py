"""Where a tool call's time goes through the gateway: a wire timeline of one load (bench/mcp.py
``--timeline``), and the CPU pinning of the benchmark's processes (``--cpus-*``).

The gateway runs under :data:`TIMED_MAIN`: between SIGUSR1 and SIGUSR2 every ``recv`` and
``send`` of its sockets (asyncio's selector transports call ``socket.recv`` and
``socket.send``) is stamped with ``time.perf_counter`` (``CLOCK_MONOTONIC``, the clock of the
benchmark's client too) and the call it carries (the echoed text ``hi N`` is unique per call of
a load). :func:`decompose` joins those stamps with the client's own (send, answer) stamps of
the same calls into five segments per call, in ms:

* ``to gateway``: the client starts the call -> the gateway's loop reads its first bytes (the
  client's own send path, the kernel, and the time the request waits for the gateway's loop);
* ``gateway in``: read -> the request written to the upstream connection (the gateway's own
  work on the request, and whatever preempted it on its core);
* ``upstream``: written upstream -> the gateway's loop reads the answer's first bytes (the
  server, and the time the answer waits for the gateway's loop);
* ``gateway out``: answer read -> the answer written to the client;
* ``to client``: written -> the client has the whole answer (its own loop's wait).

The tracing costs the gateway a few microseconds per socket call; it runs in a load of its
own, after the measured ones.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

# argv: OUT GATEWAY_PORT UPSTREAM_PORT gateway-cli-args...
TIMED_MAIN = """
import json, re, signal, socket, sys, time
from gateway.cli import main
out, gw_port, up_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
key = re.compile(rb"hi (\\d+)")
events, roles = [], {}
recv0, send0 = socket.socket.recv, socket.socket.send
clock = time.perf_counter
def role(sock):
    r = roles.get(sock)
    if r is None:
        r = ""
        if sock.family in (socket.AF_INET, socket.AF_INET6):  # not the loop's self-pipe
            try:
                r = ("c" if sock.getsockname()[1] == gw_port
                     else "u" if sock.getpeername()[1] == up_port else "")
            except OSError:
                pass
        roles[sock] = r
    return r
def recv(self, *args):
    data = recv0(self, *args)
    t = clock()
    r = role(self)
    if r and data:
        m = key.search(data)
        events.append((t, r, "r", self.fileno(), int(m[1]) if m else -1))
    return data
def send(self, data, *args):
    t = clock()
    r = role(self)
    if r:
        m = key.search(data)
        events.append((t, r, "s", self.fileno(), int(m[1]) if m else -1))
    return send0(self, data, *args)
def start(*_):
    events.clear()
    roles.clear()
    socket.socket.recv, socket.socket.send = recv, send
def stop(*_):
    del socket.socket.recv, socket.socket.send
    with open(out + ".part", "w") as f:
        json.dump(events, f)
    import os
    os.replace(out + ".part", out)
    roles.clear()
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
sys.exit(main(sys.argv[4:]))
"""

SEGMENTS = ("to gateway", "gateway in", "upstream", "gateway out", "to client")


ROLES = {"g": "gateway", "s": "server", "c": "client"}


def parse_plan(text: str) -> dict[str, set[int]]:
    """A CPU pinning plan: ``free`` (nothing pinned) or ``g=1:s=0:c=0``: role letter
    (``g`` the gateway(s), ``s`` the MCP server, ``c`` this client) = CPU list in
    ``taskset -c`` syntax (``0``, ``0,1``, ``0-1``); a role not named is not pinned.

    Raises:
        ValueError: An unknown role letter or a CPU list that is not one.
    """
    plan: dict[str, set[int]] = {}
    for part in ([] if text in ("", "free") else text.split(":")):
        role, _, cpus = part.partition("=")
        plan[ROLES[role]] = {cpu for item in cpus.split(",") for cpu in range(
            int(item.partition("-")[0]), int(item.partition("-")[2] or item) + 1)}
    return plan


def pin(plan: dict[str, set[int]], pids: dict[str, list[int]], every: set[int]) -> None:
    """Apply ``plan`` to running processes, every thread of each (``/proc/PID/task``;
    threads started later inherit it): role -> pids; a role the plan does not name gets
    ``every`` CPU (what a previous plan pinned is undone)."""
    for role, role_pids in pids.items():
        for pid in role_pids:
            for task in Path(f"/proc/{pid}/task").iterdir():
                os.sched_setaffinity(int(task.name), plan.get(role, every))


def decompose(events_file: Path, calls: list[tuple[int, float, float]]) -> dict[str, list[float]]:
    """The five segments (ms) of each traced call (see the module docstring).

    Args:
        events_file: The gateway's stamps: ``[t_s, role ("c" client side, "u" upstream),
            "r"|"s", fd, call key or -1]`` in the order they happened.
        calls: The client's ``(key, t_sent_s, t_answered_s)`` of the gateway's calls.

    Returns:
        Segment name -> one value per call found whole in the timeline, plus ``"total"`` and
        ``"gateway own"`` (``gateway in`` + ``gateway out``).
    """
    events = json.loads(events_file.read_text())
    first_read: dict[int, float] = {}  # client fd -> first read of the request in progress
    upstream_key: dict[int, int] = {}  # upstream fd -> the call written on it, not answered
    at: dict[str, dict[int, float]] = {"in": {}, "fwd": {}, "up": {}, "out": {}}
    for t, role, op, fd, key in events:
        if role == "c":
            if op == "r":
                first_read.setdefault(fd, t)
            elif key >= 0:
                at["in"][key] = first_read.pop(fd, t)
                at["out"][key] = t
        elif op == "s" and key >= 0:
            at["fwd"][key] = t
            upstream_key[fd] = key
        elif op == "r" and fd in upstream_key:
            at["up"][upstream_key.pop(fd)] = t
    out: dict[str, list[float]] = {name: [] for name in (*SEGMENTS, "total", "gateway own")}
    for key, sent, answered in calls:
        if not all(key in stamps for stamps in at.values()):
            continue
        marks = (sent, at["in"][key], at["fwd"][key], at["up"][key], at["out"][key], answered)
        for name, begin, end in zip(SEGMENTS, marks, marks[1:], strict=False):
            out[name].append((end - begin) * 1000)
        out["total"].append((answered - sent) * 1000)
        out["gateway own"].append(out["gateway in"][-1] + out["gateway out"][-1])
    return out


def report(segments: dict[str, list[float]], calls: int, direct: list[float]) -> None:
    """Print each segment's p50/p99 (ms) beside the direct calls of the same load."""
    found = len(segments["total"])
    print(f" timeline of one load ({found} of {calls} gateway calls found whole); p50 and p99, "
          "ms (percentiles of each segment: they do not add up)")
    for name, values in segments.items():
        if len(values) >= 2:
            q = statistics.quantiles(values, n=100)
            print(f"  {name:12} p50 {q[49]:6.2f} p99 {q[98]:6.2f}")
    if len(direct) >= 2 and found >= 2:
        q = statistics.quantiles(direct, n=100)
        gw = statistics.quantiles(segments["total"], n=100)
        print(f"  direct calls beside: p50 {q[49]:6.2f} p99 {q[98]:6.2f}; added p50 "
              f"{gw[49] - q[49]:6.2f} p99 {gw[98] - q[98]:6.2f}")
