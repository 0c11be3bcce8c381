"""Text a bundle or its media controls never reaches the operator's terminal raw.

The tester's finding 12: ``index.sig``'s ``key_id`` is read before anything is trusted and was
printed as it was, so a bundle that FAILS verification could erase its ``FAIL`` line
(``ESC[2K``, CR), print ``OK b: signed by <the trusted key id>, ... verified`` and conceal the
rest (``ESC[8m``), or split the message with a newline. The key id is now checked to be what
it is (64 lower-case hex digits: ``signature_malformed`` otherwise, its text never shown), and
every problem line and error line of the ``airgap`` CLI escapes control and bidirectional
characters, whatever carries them: a part's file name on the media, an ML-BOM value (inspect
prints it unverified; a signed-but-hostile packer reaches verify with it).

The real CLI runs in a child process, piped and on a pseudo-terminal (tests/terminal.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from airgap_helpers import KeyPair, rewrite_bom

from airgap.bundle import SIGNATURE_NAME
from airgap.signing import key_id, sign_index
from tests.terminal import on_terminal, piped, visible_lines

FORGED = {  # what the tester put in index.sig's key_id, {kid} the trusted key's id
    "erase-and-conceal": "\x1b[2K\rOK b: signed by {kid}, 23 bytes verified in 0.0 s\x1b[8m",
    "newline": "x\nOK b: signed by {kid}",
}


def _cli(args: list[str], terminal: bool) -> tuple[int, str]:
    """Run ``airgap ARGS`` piped or on a terminal; returns (exit status, all it wrote)."""
    argv = [sys.executable, "-m", "airgap.cli", *args]
    if terminal:
        run = on_terminal(argv, columns=200)
        return run.returncode, run.screen
    res = piped(argv)
    return res.returncode, res.stdout + res.stderr


def _assert_not_forged(text: str, terminal: bool) -> None:
    """None of the injected sequences reached the terminal; no line claims OK."""
    for seq in ("\x1b[2K\rOK", "\x1b[8m", "\x1b]0;", "\x07", "\u202e"):
        assert seq not in text
    if not terminal:
        assert "\x1b" not in text and "\r" not in text
    assert not [line for line in visible_lines(text) if line.lstrip().startswith("OK")], text


def _said(text: str) -> str:
    """What a reader reads: the visible lines joined, wrapped sentences made whole again."""
    return " ".join(line.strip() for line in visible_lines(text))


def _forge_key_id(bundle: Path, value: str) -> None:
    doc: dict[str, Any] = json.loads((bundle / SIGNATURE_NAME).read_text())
    doc["key_id"] = value
    (bundle / SIGNATURE_NAME).write_text(json.dumps(doc))


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
@pytest.mark.parametrize("forged", FORGED.values(), ids=FORGED.keys())
def test_a_forged_key_id_is_malformed_and_never_printed(
    bundle: Path, keys: KeyPair, other_keys: KeyPair, tmp_path: Path, forged: str,
    terminal: bool,
) -> None:
    # Signed by another key; the signature file claims a key id that paints an OK line.
    data = (bundle / "index.json").read_bytes()
    (bundle / SIGNATURE_NAME).write_bytes(sign_index(data, other_keys.private))
    _forge_key_id(bundle, forged.format(kid=key_id(keys.public)))
    store = tmp_path / "store"
    for args, status in (
        (["verify", str(bundle), "-k", str(keys.public_path), "-q"], 1),
        (["unpack", str(bundle), "-k", str(keys.public_path), "--into", str(store), "-q"], 1),
        (["inspect", str(bundle)], 0),
    ):
        rc, text = _cli(args, terminal)
        assert rc == status, text
        _assert_not_forged(text, terminal)
        said = _said(text)
        if args[0] == "inspect":
            assert "signer key id (claimed, unverified): (signature_malformed)" in said
        else:
            assert "signature_malformed" in said, text
            assert "index.sig is malformed: key_id is not 64 lower-case hex digits" in said
    assert not store.exists()


def test_a_well_formed_key_id_of_another_key_is_still_untrusted(
    bundle: Path, keys: KeyPair, other_keys: KeyPair
) -> None:
    data = (bundle / "index.json").read_bytes()
    (bundle / SIGNATURE_NAME).write_bytes(sign_index(data, other_keys.private))
    rc, text = _cli(["verify", str(bundle), "-k", str(keys.public_path), "-q"], False)
    assert rc == 1
    assert (f"FAIL signature_untrusted_key: index signed by key {key_id(other_keys.public)[:16]}"
            in text)


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_a_part_file_name_on_the_media_is_shown_escaped(
    bundle: Path, keys: KeyPair, terminal: bool
) -> None:
    # A file name on the stick is nobody's signed text; verify names it as an extra part.
    name = "payload\x1b[2K\rOK b: signed by you\x1b[8m"
    (bundle / name).write_bytes(b"x")
    rc, text = _cli(["verify", str(bundle), "-k", str(keys.public_path), "-q"], terminal)
    assert rc == 1
    _assert_not_forged(text, terminal)
    said = _said(text)
    assert ('FAIL part_extra: "payload\\u001b[2K\\rOK b: signed by you\\u001b[8m" is not listed '
            "in the index") in said, text


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_ml_bom_text_is_shown_escaped_by_inspect_verify_and_unpack(
    bundle: Path, keys: KeyPair, tmp_path: Path, terminal: bool
) -> None:
    # A signed-but-hostile packer (or anyone, for inspect, which checks no signature) writes
    # terminal sequences into the ML-BOM's model name.
    hostile = "x\x1b]0;owned\x07\nOK b: signed by you\u202e"

    def edit(doc: dict[str, Any]) -> None:
        doc["components"][0]["name"] = hostile

    rewrite_bom(bundle, keys.private, edit)
    rc, text = _cli(["inspect", str(bundle)], terminal)
    assert rc == 0
    _assert_not_forged(text, terminal)
    assert "x\\x1b]0;owned\\x07\\x0aOK b: signed by you\\u202e@" in _said(text)
    rc, text = _cli(["verify", str(bundle), "-k", str(keys.public_path), "-q"], terminal)
    assert rc == 1
    _assert_not_forged(text, terminal)
    said = ("mlbom_mismatch: ml-bom.cdx.json: model x\\x1b]0;owned\\x07\\x0aOK b: signed by "
            "you\\u202e is not in the index")
    assert f"FAIL {said}" in _said(text), text
    rc, text = _cli(["unpack", str(bundle), "-k", str(keys.public_path), "--into",
                     str(tmp_path / "store"), "-q"], terminal)
    assert rc == 1
    _assert_not_forged(text, terminal)
    assert f"airgap: error [{said.replace(':', ']:', 1)}" in _said(text), text
