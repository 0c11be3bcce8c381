"""Child process of ``test_policy_dns.py``: runs inside its own network namespace.

It listens as the only DNS server (UDP 127.0.0.1:53, which ``/etc/resolv.conf`` names in this
mount namespace), installs the egress guard, tries every Python path that can send a name (or a
reverse lookup) to DNS, and prints JSON: what each path raised, which queries reached the
listener, and the guard's events. Usage: ``python _dns_probe_proc.py MODE ALLOWED_NAME``.
"""

from __future__ import annotations

import _socket
import asyncio
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Callable

from policy import EgressEvent, EgressGuard, Policy

PORT = 443
#: The probe whose query cannot be stopped in-process (it is only recorded).
UNBOUND = "unbound _socket.socket.connect"


def _qname(packet: bytes) -> str:
    labels, i = [], 12
    while i < len(packet) and packet[i]:
        n = packet[i]
        labels.append(packet[i + 1:i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    return ".".join(labels).lower()


def _answer(query: bytes, qname: str) -> bytes:
    """REFUSED for every name, except an A record (192.0.2.10, TTL 0) for ``unbound.*``.

    Message layout: RFC 1035 4.1; the answer names the question by pointer 0xC00C.
    """
    head = query[:2]
    if qname.startswith("unbound.") and query[-4:] == b"\x00\x01\x00\x01":  # A, IN
        return (head + bytes([0x81, 0x80]) + query[4:6] + b"\x00\x01\x00\x00\x00\x00"
                + query[12:] + b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x00\x00\x04"
                + bytes([192, 0, 2, 10]))
    # Same id and question, QR=1 RD=1 RA=1, RCODE=5 (REFUSED).
    return head + bytes([0x81, 0x85]) + query[4:6] + bytes(6) + query[12:]


def listen() -> None:
    """Serve as the DNS server until stdin closes: answer REFUSED at once, then print the names.

    Runs in its own process so the guard under test (process-wide) never sees its replies.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 53))
    sock.settimeout(0.05)
    queries: list[str] = []
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    print("ready", flush=True)
    while not stop.is_set():
        try:
            packet, peer = sock.recvfrom(4096)
        except TimeoutError:
            continue
        qname = _qname(packet)
        queries.append(qname)
        sock.sendto(_answer(packet, qname), peer)
    # A query sent by a call that has returned is already in the socket buffer: drain it.
    sock.setblocking(False)
    while True:
        try:
            packet, _ = sock.recvfrom(4096)
        except BlockingIOError:
            break
        queries.append(_qname(packet))
    print(json.dumps(sorted(set(queries))), flush=True)


def _probes(suffix: str) -> dict[str, Callable[[], object]]:
    def n(path: str) -> str:
        return f"{path}.{suffix}"

    def tcp() -> socket.socket:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)

    def udp() -> socket.socket:
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    class RawSubclass(_socket.socket):
        pass

    async def loop_connect() -> None:
        await asyncio.get_running_loop().create_connection(asyncio.Protocol, n("loop-connect"),
                                                           PORT)

    async def loop_sock_sendto() -> None:
        with udp() as s:
            s.setblocking(False)
            await asyncio.get_running_loop().sock_sendto(s, b"x", (n("loop-sock-sendto"), 53))

    return {
        "getaddrinfo": lambda: socket.getaddrinfo(n("getaddrinfo"), PORT),
        "_socket.getaddrinfo": lambda: _socket.getaddrinfo(n("c-getaddrinfo"), PORT),
        "gethostbyname": lambda: socket.gethostbyname(n("gethostbyname")),
        "gethostbyname_ex": lambda: socket.gethostbyname_ex(n("gethostbyname-ex")),
        "gethostbyaddr(name)": lambda: socket.gethostbyaddr(n("gethostbyaddr")),
        "gethostbyaddr(address)": lambda: socket.gethostbyaddr("192.0.2.7"),
        "getnameinfo": lambda: socket.getnameinfo(("192.0.2.8", PORT), 0),
        "getfqdn": lambda: socket.getfqdn("192.0.2.9"),
        "create_connection": lambda: socket.create_connection((n("create-connection"), PORT)),
        "connect": lambda: tcp().connect((n("connect"), PORT)),
        "connect_ex": lambda: tcp().connect_ex((n("connect-ex"), PORT)),
        "udp connect": lambda: udp().connect((n("udp-connect"), 53)),
        "sendto": lambda: udp().sendto(b"x", (n("sendto"), 53)),
        "sendto(flags)": lambda: udp().sendto(b"x", 0, (n("sendto-flags"), 53)),
        "sendmsg": lambda: udp().sendmsg([b"x"], [], 0, (n("sendmsg"), 53)),
        "bind": lambda: udp().bind((n("bind"), 0)),
        "ipv6 connect": lambda: socket.socket(socket.AF_INET6).connect((n("connect6"), PORT)),
        "_socket.socket": lambda: _socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(
            (n("raw-socket"), PORT)),
        "_socket.socket subclass": lambda: RawSubclass(socket.AF_INET, socket.SOCK_DGRAM).sendto(
            b"x", (n("raw-subclass"), 53)),
        "loop.create_connection": lambda: asyncio.run(loop_connect()),
        # The known limit: the C method called unbound resolves before any Python code runs.
        UNBOUND: lambda: _socket.socket.connect(tcp(), (n("unbound"), PORT)),
        "loop.sock_sendto": lambda: asyncio.run(loop_sock_sendto()),
    }


def main(mode: str, allowed: str, suffix: str) -> None:
    listener = subprocess.Popen([sys.executable, __file__, "listen"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    assert listener.stdout is not None and listener.stdin is not None
    if listener.stdout.readline().strip() != "ready":
        raise SystemExit("DNS listener did not start")
    events: list[EgressEvent] = []
    policy = Policy.from_text(
        "version: 1\ndata_classes: [public]\ndestinations:\n"
        f"  - {{id: api, host: {allowed}, port: {PORT}, region: r, jurisdiction: EU,"
        " operator: o}\n"
    )
    results: dict[str, str] = {}
    if mode not in ("enforce", "monitor"):
        raise SystemExit(f"mode must be enforce or monitor, not {mode!r}")
    EgressGuard(policy, "enforce" if mode == "enforce" else "monitor",
                on_event=events.append).install()
    for name, probe in [*_probes(suffix).items(),
                        ("allowed getaddrinfo", lambda: socket.getaddrinfo(allowed, PORT))]:
        try:
            probe()
            results[name] = "ok"
        except Exception as exc:
            results[name] = type(exc).__name__
    listener.stdin.close()
    queries = json.loads(listener.stdout.readline())
    listener.wait(10)
    print(json.dumps({
        "results": results,
        "queries": queries,
        "events": [e.as_record() for e in events],
    }))


if __name__ == "__main__":
    if sys.argv[1] == "listen":
        listen()
    else:
        main(sys.argv[1], sys.argv[2], sys.argv[3])
