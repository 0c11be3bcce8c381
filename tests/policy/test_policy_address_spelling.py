"""What a policy names is what it enforces: coverage by union, canonical spellings, plain output.

* Destinations whose networks together hold every IPv4 (or IPv6) address are refused as a
  single ``/0`` is, however the space is split (``0.0.0.0/1`` + ``128.0.0.0/1``).
* A host, address or CIDR written other than as it is enforced is refused, naming the
  destination, the field and the form to write: non-ASCII, the ``inet_aton`` forms
  (``010.0.0.1`` is 8.0.0.1), IPv6 zone indexes.
* ``policy check`` / ``policy connect`` print IPv6 addresses and operator names as they are:
  rich's ``:emoji:`` codes (``2001:db8::a:b`` holds ``:a:``) are off.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from policy_testdata import BASE

from policy import Policy, PolicyFileError
from policy.cli import main

A = "url: http://10.20.0.11:8000"


def _extra(*dests: str) -> str:
    """BASE with more cidr destinations (``id cidr`` pairs) on port 443."""
    blocks = "".join(textwrap.indent(textwrap.dedent(f"""\
        - id: {d.split()[0]}
          cidr: "{d.split()[1]}"
          ports: [443]
          region: eu-de-1
          jurisdiction: EU
          operator: acme
        """), "  ") for d in dests)
    return BASE.replace("rules:\n", blocks + "rules:\n", 1)


def _err(text: str) -> str:
    with pytest.raises(PolicyFileError) as info:
        Policy.from_text(text, "p.yaml")
    assert info.value.code == "invalid_policy"
    return str(info.value)


@pytest.mark.parametrize(("dests", "version", "everything"), [
    (("low 0.0.0.0/1", "high 128.0.0.0/1"), 4, "0.0.0.0/0"),
    (("q1 0.0.0.0/2", "q2 64.0.0.0/2", "q3 128.0.0.0/2", "q4 192.0.0.0/2"), 4, "0.0.0.0/0"),
    (("low ::/1", "high 8000::/1"), 6, "::/0"),
])
def test_destinations_that_together_cover_everything_are_refused(
        dests: tuple[str, ...], version: int, everything: str) -> None:
    err = _err(_extra(*dests))
    assert (f"p.yaml:13: destinations: destinations together cover every IPv{version} address, "
            f"as {everything} would: ") in err, err
    for d in dests:
        name, net = d.split()
        assert f"{name} ({net})" in err
    assert "a policy may not allow every address, however it is split" in err


def test_broad_union_short_of_everything_loads() -> None:
    Policy.from_text(_extra("low 0.0.0.0/1", "high 128.0.0.0/2", "v6 ::/1"), "p.yaml")


@pytest.mark.parametrize(("endpoint", "message"), [
    ("url: http://010.20.0.11:8000", "url host of destination 'vllm-eu-a' '010.20.0.11' is a "
     "legacy spelling of 8.20.0.11 (inet_aton: a leading 0 means octal, 0x hex; missing parts "
     "are zero): write 8.20.0.11"),
    ("host: '10.1'\n    port: 8000", "host of destination 'vllm-eu-a' '10.1' is a legacy spelling "
     "of 10.0.0.1"),
    ("host: '0x0a141400'\n    port: 8000", "is a legacy spelling of 10.20.20.0"),
    ("cidr: 012.0.0.0/8\n    ports: [1]", "cidr of destination 'vllm-eu-a' '012.0.0.0/8' is a "
     "legacy spelling of 10.0.0.0 (inet_aton: a leading 0 means octal, 0x hex; missing parts "
     "are zero): write 10.0.0.0/8"),
    ("url: http://bücher.example:8000", "url host of destination 'vllm-eu-a' 'bücher.example' "
     "holds non-ASCII characters (U+00FC): write hosts and addresses in ASCII; its ASCII form "
     "is 'xn--bcher-kva.example'"),
    ("host: \uff12.example\n    port: 1", "holds non-ASCII characters (U+FF12): write hosts and "
     "addresses in ASCII; its ASCII form is '2.example'"),
    ("url: 'http://[fe80::1%25eth0]:8000'", "url host of destination 'vllm-eu-a' "
     "'fe80::1%25eth0' has a zone index, which names an interface, not an address: write "
     "fe80::1"),
    ("url: http://10.20.0.11:8000/ä", "url of destination 'vllm-eu-a' "
     "'http://10.20.0.11:8000/ä' holds non-ASCII characters"),
])
def test_hosts_and_addresses_not_written_as_enforced_are_refused(
        endpoint: str, message: str) -> None:
    err = _err(BASE.replace(A, endpoint))
    assert err.startswith("p.yaml:14: destinations[0]: "), err
    assert message in err, err


def test_resolves_to_is_checked_too() -> None:
    url = "url: https://api.provider.example/v1"
    err = _err(BASE.replace(url, f"{url}\n    resolves_to: [0203.0.113.0/24]"))
    assert "resolves_to of destination 'provider-us' '0203.0.113.0/24' is a legacy spelling of " \
           "131.0.113.0" in err


@pytest.mark.parametrize("endpoint", ["url: 'http://[2001:DB8::A:B]:8000'",
                                      "host: 2001:0db8:0:0:0:0:a:b\n    port: 8000",
                                      "url: http://API.example:8000"])
def test_unambiguous_spellings_still_load(endpoint: str) -> None:
    Policy.from_text(BASE.replace(A, endpoint), "p.yaml")


def test_cli_prints_ipv6_and_names_as_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(BASE.replace(A, "url: 'http://[2001:db8::a:b]:8000'")
                    .replace("operator: acme\n    tags: [no-retention",
                             "operator: 'team :smile: :a:'\n    tags: [no-retention"))
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "vllm-eu-a  2001:db8::a:b/128:8000" in out
    assert "operator team :smile: :a:;" in out
    for target, line in [("[2001:db8::a:b]:8000", "allow connect 2001:db8::a:b: address of "
                          "destination vllm-eu-a"),
                         ("[::ab:cd]:80", "deny connect ::ab:cd: no destination allows "
                          "[::ab:cd]:80")]:
        main(["connect", str(path), target])
        assert capsys.readouterr().out.strip() == line
    assert out.isascii(), out  # no emoji in place of ":smile:" or ":a:"
