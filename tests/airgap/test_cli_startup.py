"""`airgap verify` start-up: what it loads, and its fast command-line parser equals typer's.

The fast parser (``airgap.cli._fast_verify_args``) skips typer's parse, whose pydantic
TypeAdapters cost about 0.25 CPU-s per run, and typer's import (the typer application lives in
``airgap.cli_app``). These tests hold it to the typer command: same
options, same results, and everything it does not take goes through typer unchanged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from airgap_helpers import KeyPair

from airgap import cli, cli_verify
from airgap.cli import main

#: Modules `airgap verify` must not import: heavy, and verify does not need them.
NOT_FOR_VERIFY = ("typer", "click", "pydantic", "rich", "rich.table", "rich.markdown",
                  "airgap.pack",
                  "airgap.unpack", "airgap.install", "airgap.oci", "cyclonedx", "model_signing",
                  "cryptography.x509", "cryptography.hazmat.primitives.serialization")


def test_fast_parser_options_equal_the_typer_command() -> None:
    group = typer.main.get_command(cli.app)
    command = group.commands["verify"]  # type: ignore[attr-defined]
    typer_opts: dict[str, tuple[str, bool, bool]] = {}
    arguments = []
    for p in command.params:
        if p.param_type_name == "argument":
            arguments.append(p.name)
            continue
        for opt in (*p.opts, *p.secondary_opts):
            typer_opts[opt] = (p.name, not p.is_flag, bool(p.multiple))
    assert arguments == ["bundle"]
    assert typer_opts == cli._VERIFY_OPTIONS  # (--help is added by click at parse time)


@pytest.mark.parametrize("argv", [
    ["verify", "B", "-k", "K"],
    ["verify", "-k", "K", "B"],
    ["verify", "B", "--public-key=K", "-k", "K2", "--lock", "L", "--all-parts", "--json",
     "--workers=3", "-q"],
])
def test_fast_parser_takes_plain_command_lines(argv: list[str]) -> None:
    kwargs = cli._fast_verify_args(argv)
    assert kwargs is not None
    assert kwargs["bundle"] == Path("B")
    assert kwargs["public_key"][0] == Path("K")
    if "--json" in argv:
        assert kwargs == {"bundle": Path("B"), "public_key": [Path("K"), Path("K2")],
                          "expected_lock": Path("L"), "all_parts": True, "as_json": True,
                          "workers": 3, "quiet": True}


@pytest.mark.parametrize("argv", [
    ["verify", "--help"], ["verify", "B"], ["verify", "-k", "K"], ["verify", "B", "C", "-k", "K"],
    ["verify", "B", "-k"], ["verify", "B", "-k", "K", "--workers", "-1"],
    ["verify", "B", "-k", "K", "--workers", "x"], ["verify", "B", "-k", "K", "-qk", "K"],
    ["verify", "B", "-k", "K", "--json", "--json"], ["verify", "B", "-k", "K", "--", "C"],
    ["verify", "B", "-k", "K", "--json=1"], ["verify", "B", "-k", "K", "--bogus"],
    ["verify", "B", "-k", "K", "--lock", "L", "--lock", "M"], ["unpack", "B", "-k", "K"],
])
def test_fast_parser_leaves_everything_else_to_typer(argv: list[str]) -> None:
    assert cli._fast_verify_args(argv) is None


def test_fast_and_typer_paths_give_the_same_result(
        bundle: Path, keys: KeyPair, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["verify", str(bundle), "-k", str(keys.public_path), "--json", "--workers", "1"]
    assert main(argv) == 0
    fast = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(cli, "_fast_verify_args", lambda args: None)
    assert main(argv) == 0
    slow = json.loads(capsys.readouterr().out)
    for doc in (fast, slow):  # timings differ from run to run
        for key in ("seconds", "cpu_seconds"):
            doc.pop(key, None)
    assert fast == slow and fast["ok"] is True
    # A failure: exit 1 and the same problems either way.
    (bundle / "index.sig").write_bytes(b"x" * 64)
    monkeypatch.undo()
    assert main(argv) == 1
    fast = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(cli, "_fast_verify_args", lambda args: None)
    assert main(argv) == 1
    slow = json.loads(capsys.readouterr().out)
    assert fast == slow and fast["ok"] is False


def test_verify_does_not_import_what_it_does_not_need(bundle: Path, keys: KeyPair,
                                                      tmp_path: Path) -> None:
    loaded = tmp_path / "modules.json"
    code = ("import json, sys\n"
            "from airgap.cli import main\n"
            "rc = main(sys.argv[2:])\n"
            "open(sys.argv[1], 'w').write(json.dumps(sorted(sys.modules)))\n"
            "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code, str(loaded), "verify", str(bundle), "-k",
                        str(keys.public_path), "-q"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("OK ")
    modules = set(json.loads(loaded.read_text()))
    assert "airgap.verify" in modules  # the probe sees the real run
    heavy = sorted(m for m in modules
                   if any(m == n or m.startswith(n + ".") for n in NOT_FOR_VERIFY))
    assert heavy == []


def test_plain_output_equals_rich_output(bundle: Path, keys: KeyPair,
                                         capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped, verify prints without rich; the bytes are what rich's console printed."""
    from rich.console import Console

    doc = {"ok": True, "bundle": str(bundle), "problems": [{"code": "x", "message": "é [b]"}],
           "n": 3, "f": 0.5, "none": None}
    cli_verify._print_json(doc)
    cli_verify._print_line(f"OK {bundle}: signed by ab12, 7 bytes verified in 0.0 s (0.00 GiB/s)")
    plain = capsys.readouterr().out
    monkeypatch.setenv("TTY_COMPATIBLE", "0")  # rich, not styled: what the CLI printed before
    console = Console(soft_wrap=True, markup=False)
    console.print_json(json.dumps(doc))
    console.print(f"OK {bundle}: signed by ab12, 7 bytes verified in 0.0 s (0.00 GiB/s)")
    assert capsys.readouterr().out == plain


def test_public_key_fast_path_equals_cryptography(tmp_path: Path, keys: KeyPair) -> None:
    """The plain Ed25519 PEM parse gives cryptography's key; every other form goes to
    cryptography's loader and gets its verdict."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from airgap.errors import AirgapError
    from airgap.signing import _ed25519_spki, key_id, load_public_key

    pem = keys.public_path.read_bytes()
    fast = _ed25519_spki(pem)
    assert fast is not None
    assert key_id(fast) == key_id(keys.public) == key_id(load_public_key(keys.public_path))
    full = serialization.load_pem_public_key(pem)
    assert isinstance(full, Ed25519PublicKey)
    assert fast.public_bytes_raw() == full.public_bytes_raw()
    # CRLF line ends: still the same key.
    crlf = tmp_path / "crlf.pem"
    crlf.write_bytes(pem.replace(b"\n", b"\r\n"))
    assert key_id(load_public_key(crlf)) == key_id(keys.public)
    # An EC key and garbage: not the fast form, so cryptography decides (key_invalid).
    ec_pem = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert _ed25519_spki(ec_pem) is None
    for name, data in (("ec.pem", ec_pem), ("junk.pem", b"not a key"),
                       ("cut.pem", pem[:40] + pem[-26:])):
        bad = tmp_path / name
        bad.write_bytes(data)
        assert _ed25519_spki(data) is None
        with pytest.raises(AirgapError) as err:
            load_public_key(bad)
        assert err.value.code == "key_invalid"
