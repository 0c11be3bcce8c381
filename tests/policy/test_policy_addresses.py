"""Every spelling of one address or hostname must compare equal."""

from __future__ import annotations

import ipaddress

import pytest

from policy.addresses import always_denied_reason, normalize_hostname, parse_host, parse_ip

LOOPBACK = ipaddress.IPv4Address("127.0.0.1")


@pytest.mark.parametrize(
    "spelling",
    ["127.0.0.1", "127.1", "2130706433", "0x7f000001", "0177.0.0.1", "0x7f.1", "127.0.1",
     "::ffff:127.0.0.1", "[::ffff:127.0.0.1]", "::FFFF:7f00:1", " 127.0.0.1 "],
)
def test_legacy_and_mapped_spellings_are_loopback(spelling: str) -> None:
    assert parse_ip(spelling) == LOOPBACK


@pytest.mark.parametrize(
    "text", ["example.com", "1.2.3.4.5", "256.1.1.1", "4294967296", "0x1g", "1e3", "", "::g", "-1"]
)
def test_non_addresses_are_not_addresses(text: str) -> None:
    assert parse_ip(text) is None


def test_ipv6_zone_is_dropped_and_brackets_accepted() -> None:
    assert parse_ip("fe80::1%eth0") == ipaddress.IPv6Address("fe80::1")
    assert parse_ip("[::1]") == ipaddress.IPv6Address("::1")


@pytest.mark.parametrize(
    "spelling", ["api.example.com", "API.Example.COM", "api.example.com.", "API.EXAMPLE.COM."]
)
def test_hostnames_normalise(spelling: str) -> None:
    assert normalize_hostname(spelling) == "api.example.com"
    assert parse_host(spelling) == "api.example.com"


def test_idna_hostname_becomes_punycode() -> None:
    assert normalize_hostname("Bücher.example") == "xn--bcher-kva.example"


@pytest.mark.parametrize("bad", ["", ".", "a..b", "-a.example", "a b.example", "a/b", "x" * 64])
def test_invalid_hostnames_raise(bad: str) -> None:
    with pytest.raises(ValueError):
        normalize_hostname(bad)


@pytest.mark.parametrize(
    ("address", "denied"),
    [
        ("169.254.169.254", True),
        ("::ffff:169.254.169.254", True),
        ("2852039166", True),  # 169.254.169.254 as one number
        ("fe80::1", True),
        ("0.0.0.0", True),  # noqa: S104
        ("0", True),
        ("::", True),
        ("fd00:ec2::254", True),
        ("127.0.0.1", False),
        ("10.0.0.1", False),
        ("2001:db8::1", False),
    ],
)
def test_always_denied(address: str, denied: bool) -> None:
    ip = parse_ip(address)
    assert ip is not None
    assert (always_denied_reason(ip) is not None) is denied
