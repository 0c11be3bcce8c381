"""Canonical parsing of hosts and addresses, so that every spelling of one address compares equal.

The C library accepts many spellings of one IPv4 address (``inet_aton(3)``: ``127.1``,
``2130706433``, ``0x7f000001``, ``0177.0.0.1``), IPv6 can carry an IPv4 address in its mapped
form (``::ffff:127.0.0.1``, RFC 4291 section 2.5.5.2), and DNS names are case-insensitive with
an optional trailing root dot (RFC 4343, RFC 1034 section 3.1). A policy check that compared
raw strings could be walked around with any of these; everything here maps each spelling to
one canonical value before it is compared.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Final

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL: Final = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")

#: Addresses that are denied even when a rule would allow them, unless a destination names them
#: explicitly (as an address or inside its CIDR): link-local (which holds the cloud metadata
#: services), "this host", unspecified, broadcast and multicast, and well-known metadata
#: endpoints outside link-local.
ALWAYS_DENIED: Final[tuple[tuple[IPNetwork, str], ...]] = (
    (ipaddress.ip_network("169.254.0.0/16"), "link-local / cloud metadata"),
    (ipaddress.ip_network("fe80::/10"), "link-local / cloud metadata"),
    (ipaddress.ip_network("fd00:ec2::254/128"), "cloud metadata (AWS IPv6)"),
    (ipaddress.ip_network("100.100.100.200/32"), "cloud metadata (Alibaba)"),
    (ipaddress.ip_network("168.63.129.16/32"), "cloud platform endpoint (Azure wireserver)"),
    (ipaddress.ip_network("0.0.0.0/8"), "'this network' / unspecified"),
    (ipaddress.ip_network("::/128"), "unspecified"),
    (ipaddress.ip_network("255.255.255.255/32"), "broadcast"),
    (ipaddress.ip_network("224.0.0.0/4"), "multicast"),
    (ipaddress.ip_network("ff00::/8"), "multicast"),
)


def canonical_ip(ip: IPAddress) -> IPAddress:
    """Map an IPv4-mapped IPv6 address to its IPv4 address; return others unchanged."""
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped
        if mapped is not None:
            return mapped
        if ip.scope_id is not None:
            # A zone index (fe80::1%eth0) names an interface, not another address.
            return ipaddress.IPv6Address(int(ip))
    return ip


def _legacy_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """Parse the ``inet_aton(3)`` forms: 1 to 4 parts, each decimal, ``0x`` hex or ``0`` octal."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        low = part.lower()
        try:
            if low.startswith("0x"):
                values.append(int(low[2:], 16) if len(low) > 2 else 0)
            elif len(low) > 1 and low.startswith("0"):
                values.append(int(low[1:], 8))
            elif low.isdigit():
                values.append(int(low, 10))
            else:
                return None
        except ValueError:
            return None
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = 0
    for v in head:
        number = (number << 8) | v
    number = (number << (8 * (4 - len(head)))) | last
    return ipaddress.IPv4Address(number)


def parse_ip(text: str) -> IPAddress | None:
    """Parse any spelling of an IP address, or return ``None`` when ``text`` is not one.

    Accepts dotted-quad and the legacy ``inet_aton`` forms (``127.1``, ``2130706433``,
    ``0x7f000001``, ``0177.0.0.1``), IPv6 with or without brackets and zone index, and maps
    IPv4-mapped IPv6 (``::ffff:127.0.0.1``) to the IPv4 address.

    Args:
        text: the host part as written in a URL, a socket address or a policy file.

    Returns:
        The canonical address, or ``None`` for anything that is not an address literal.
    """
    s = text.strip()
    if s.startswith("[") and s.endswith("]"):
        s = s[1:-1]
    if ":" in s:
        s = s.split("%", 1)[0]  # zone index: an interface, not part of the address
        try:
            return canonical_ip(ipaddress.IPv6Address(s))
        except ValueError:
            return None
    if not s or not (s[0].isdigit()):
        return None
    try:
        return ipaddress.IPv4Address(s)
    except ValueError:
        return _legacy_ipv4(s)


def normalize_hostname(text: str) -> str:
    """Return the canonical form of a DNS name: lower case, no trailing dot, IDNA (punycode).

    Args:
        text: a hostname as written (``API.Example.COM.``, ``bücher.example``).

    Returns:
        The canonical ASCII name (``api.example.com``, ``xn--bcher-kva.example``).

    Raises:
        ValueError: if ``text`` is not a syntactically valid hostname.
    """
    s = text.strip()
    if s.endswith("."):
        s = s[:-1]
    if not s:
        raise ValueError("empty hostname")
    try:
        s = s.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise ValueError(f"invalid hostname {text!r}: {exc}") from exc
    s = s.lower()
    labels = s.split(".")
    if len(s) > 253 or not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"invalid hostname {text!r}")
    return s


def parse_host(text: str) -> IPAddress | str:
    """Return the canonical address for an address literal, else the normalised hostname.

    Raises:
        ValueError: if ``text`` is neither an address nor a valid hostname.
    """
    ip = parse_ip(text)
    if ip is not None:
        return ip
    return normalize_hostname(text)


def check_spelling(text: str, what: str) -> None:
    """Refuse a host, address or CIDR written other than as it is enforced.

    What the operator reads in the policy must be what is checked and rendered: non-ASCII
    (look-alike letters and digits, or an IDN name that is enforced as its punycode), the
    ``inet_aton(3)`` forms (``010.0.0.1`` is 8.0.0.1: ``0`` means octal) and IPv6 zone indexes
    (dropped: they name an interface) are refused with the canonical form to write instead.

    Args:
        text: As written in the policy (a URL's host, ``host``, a CIDR, a ``resolves_to`` item).
        what: Names the field and destination in the error.

    Raises:
        ValueError: ``text`` is not in its canonical spelling.
    """
    if not text.isascii():
        odd = ", ".join(sorted({f"U+{ord(c):04X}" for c in text if not c.isascii()}))
        try:
            hint = f"; its ASCII form is {normalize_hostname(text)!r}"
        except ValueError:
            hint = ""
        raise ValueError(f"{what} {text!r} holds non-ASCII characters ({odd}): write hosts "
                         f"and addresses in ASCII{hint}")
    address = text.split("/", 1)[0].strip("[]")
    ip = parse_ip(address)
    if ip is None:
        return
    if "%" in address:
        raise ValueError(f"{what} {text!r} has a zone index, which names an interface, not an "
                         f"address: write {ip}")
    try:
        ipaddress.ip_address(address)
    except ValueError:
        suffix = "/" + text.split("/", 1)[1] if "/" in text else ""
        raise ValueError(f"{what} {text!r} is a legacy spelling of {ip} (inet_aton: a leading "
                         f"0 means octal, 0x hex; missing parts are zero): write {ip}{suffix}"
                         ) from None


def always_denied_reason(ip: IPAddress) -> str | None:
    """Return why ``ip`` is in the always-denied set, or ``None`` when it is not."""
    ip = canonical_ip(ip)
    for net, reason in ALWAYS_DENIED:
        if ip.version == net.version and ip in net:
            return reason
    return None


def whole_families(networks: Iterable[IPNetwork]) -> list[str]:
    """The address families whose every address the union of ``networks`` holds.

    ``0.0.0.0/1`` and ``128.0.0.0/1`` hold every IPv4 address as ``0.0.0.0/0`` does; a check
    that looks at one network at a time misses that. An IPv4-mapped IPv6 network
    (``::ffff:0:0/96`` and inside) counts as the IPv4 network it is (as Go's parser, and so
    Kubernetes, reads it).

    Args:
        networks: Any networks, both families mixed.

    Returns:
        ``["0.0.0.0/0"]``, ``["::/0"]``, both, or ``[]``: the whole networks their union equals.
    """
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for net in networks:
        if isinstance(net, ipaddress.IPv4Network):
            v4.append(net)
            continue
        mapped = net.network_address.ipv4_mapped
        if mapped is not None and net.prefixlen >= 96:
            v4.append(ipaddress.IPv4Network(f"{mapped}/{net.prefixlen - 96}"))
        else:
            v6.append(net)
    whole = []
    if [str(n) for n in ipaddress.collapse_addresses(v4)] == ["0.0.0.0/0"]:
        whole.append("0.0.0.0/0")
    if [str(n) for n in ipaddress.collapse_addresses(v6)] == ["::/0"]:
        whole.append("::/0")
    return whole
