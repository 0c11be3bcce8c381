"""DNS as a data channel: in ``enforce`` mode no name the policy does not name reaches DNS.

Each test run starts ``_dns_probe_proc.py`` in a fresh network and mount namespace
(``unshare -n -m``, root): ``lo`` is the only interface, ``/etc/resolv.conf`` is bind-mounted to
name 127.0.0.1, and a DNS listener on 127.0.0.1:53 records every query it receives. The child
tries every Python path that can put a name (or a PTR query) on the wire; the same probes in
``monitor`` mode are the control that shows the listener sees each of them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
ALLOWED = "api.allowed.example"
SUFFIX = "exfil.example"
UNBOUND = "unbound _socket.socket.connect"
#: What each probe puts on the wire when nothing stops it (the listener sees these in monitor).
LEAKS = {
    "getaddrinfo": "getaddrinfo", "_socket.getaddrinfo": "c-getaddrinfo",
    "gethostbyname": "gethostbyname", "gethostbyname_ex": "gethostbyname-ex",
    "gethostbyaddr(name)": "gethostbyaddr", "gethostbyaddr(address)": "7.2.0.192.in-addr.arpa",
    "getnameinfo": "8.2.0.192.in-addr.arpa", "getfqdn": "9.2.0.192.in-addr.arpa",
    "create_connection": "create-connection", "connect": "connect", "connect_ex": "connect-ex",
    "udp connect": "udp-connect", "sendto": "sendto", "sendto(flags)": "sendto-flags",
    "sendmsg": "sendmsg", "bind": "bind", "ipv6 connect": "connect6",
    "_socket.socket": "raw-socket", "_socket.socket subclass": "raw-subclass",
    "loop.create_connection": "loop-connect", "loop.sock_sendto": "loop-sock-sendto",
    UNBOUND: "unbound",
}


def _qname(leak: str) -> str:
    return leak if leak.endswith(".arpa") else f"{leak}.{SUFFIX}"


def _run(mode: str, tmp: Path) -> dict[str, Any]:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare(1) and ip(8)")
    resolv = tmp / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    script = (f"mount --bind {resolv} /etc/resolv.conf && ip link set lo up && "
              f'exec "$0" {HERE / "_dns_probe_proc.py"} {mode} {ALLOWED} {SUFFIX}')
    try:
        proc = subprocess.run(["unshare", "-n", "-m", "sh", "-c", script, sys.executable],
                              capture_output=True, text=True, timeout=180, check=False)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"DNS probe ({mode}) did not finish: {exc.stderr!r}") from exc
    if proc.returncode != 0 and "unshare" in proc.stderr and "Operation not permitted" in (
            proc.stderr):
        pytest.skip(f"no permission for network namespaces: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@pytest.fixture(scope="module")
def enforce(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run("enforce", tmp_path_factory.mktemp("dns-enforce"))


@pytest.fixture(scope="module")
def monitor(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run("monitor", tmp_path_factory.mktemp("dns-monitor"))


def test_listener_sees_every_probe_when_nothing_blocks(monitor: dict[str, Any]) -> None:
    # The control: in monitor mode each path reaches the DNS listener, so the enforce run
    # below would see a leak on any path the guard misses.
    assert set(monitor["queries"]) >= {_qname(leak) for leak in LEAKS.values()}
    recorded = {(e["event"], e["host"]) for e in monitor["events"]}
    assert ("socket.connect", f"connect.{SUFFIX}") in recorded
    assert {e["decision"] for e in monitor["events"]} == {"monitor"}


def test_enforce_sends_no_name_the_policy_does_not_name(enforce: dict[str, Any]) -> None:
    leaked = set(enforce["queries"]) - {ALLOWED, _qname(LEAKS[UNBOUND])}
    assert leaked == set(), f"names reached DNS in enforce mode: {sorted(leaked)}"
    # The policy's own name may be resolved (the listener answers REFUSED, hence gaierror).
    assert ALLOWED in enforce["queries"]
    assert enforce["results"]["allowed getaddrinfo"] == "gaierror"


def test_every_path_is_refused_and_recorded(enforce: dict[str, Any]) -> None:
    results = enforce["results"]
    refused = {name for name, outcome in results.items() if outcome == "EgressBlocked"}
    # getfqdn catches the OSError of its reverse lookup and returns its argument.
    assert refused == set(LEAKS) - {"getfqdn"} and results["getfqdn"] == "ok"
    events = enforce["events"]
    assert all(e["decision"] == "deny" and e["type"] == "egress" for e in events)
    hosts = {e["host"] for e in events}
    for probe, leak in LEAKS.items():
        if probe.startswith("_socket.socket"):
            continue  # refused when the socket is made, before any address exists
        host = leak if not leak.endswith(".arpa") else ".".join(leak.split(".")[3::-1])
        assert (host if leak.endswith(".arpa") else _qname(leak)) in hosts, probe
    by_host = {e["host"]: e for e in events}
    assert by_host[f"sendto.{SUFFIX}"]["event"] == "socket.sendto"
    assert by_host[f"bind.{SUFFIX}"]["event"] == "socket.bind"
    assert by_host["192.0.2.8"]["event"] == "socket.getnameinfo"
    assert "PTR" in by_host["192.0.2.7"]["reason"]
    raw = [e for e in events if e["event"] == "socket.__new__"]
    assert len(raw) == 2 and all("_socket" in e["reason"] or "RawSubclass" in e["reason"]
                                 for e in raw)


def test_unbound_c_method_is_the_documented_limit(enforce: dict[str, Any]) -> None:
    # _socket.socket.connect(sock, (name, port)) resolves before any Python code runs: the
    # query leaves (the network layer's job), the connection is refused and recorded.
    assert _qname(LEAKS[UNBOUND]) in enforce["queries"]
    assert enforce["results"][UNBOUND] == "EgressBlocked"
    event = next(e for e in enforce["events"] if e["host"] == _qname(LEAKS[UNBOUND]))
    assert event["event"] == "socket.connect" and "resolved in C before" in event["reason"]
