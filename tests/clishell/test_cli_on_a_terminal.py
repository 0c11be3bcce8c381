"""Every command that draws a progress bar or a table, run as an operator runs it.

On a real pseudo-terminal 80 columns wide (the window size set on the terminal, no
``COLUMNS``), every such command of ``weights``, ``airgap`` and ``policy`` exits as it should,
prints no traceback, cuts no text with an ellipsis and draws no table line wider than the
terminal. Piped (``cmd > file``), its result is on standard output, plain (no escape
sequences), and its progress is not drawn at all. ``airgap pack/verify/unpack`` crashed on a
terminal (``'_LazyConsole' object does not support the context manager protocol``) while
piped runs and ``-q`` worked: nothing ran a CLI on a terminal.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.terminal import ROOT, on_terminal, piped, visible_lines

PY = sys.executable
CONFIGS = ROOT / "tests" / "weights" / "configs"
POLICY = ROOT / "examples" / "policy.yaml"
BOX = set("│┃┏┓┗┛┡┩└┘├┤╭╮╰╯━─")


@dataclass(frozen=True)
class Case:
    """One command line: argv (relative to the work dir), what its result must say, exit."""

    argv: list[str]
    result: str
    exit: int = 0
    # Fresh state a run needs (a bundle dir that must not exist yet ...).
    prepare: Callable[[Path], None] | None = None


def _rm(*names: str) -> Callable[[Path], None]:
    def prepare(work: Path) -> None:
        for name in names:
            shutil.rmtree(work / name, ignore_errors=True)
            (work / name).unlink(missing_ok=True) if (work / name).is_file() else None
    return prepare


CASES: dict[str, Case] = {
    "weights lock": Case([PY, "-m", "weights.cli", "lock", "model", "--repo-id", "org/tiny",
                          "--lock", "again.lock"], "locked org/tiny", prepare=_rm("again.lock")),
    "weights sign": Case([PY, "-m", "weights.cli", "sign", "model", "--key", "wkey.pem",
                          "--out", "model.sig"], "signed", prepare=_rm("model.sig")),
    "weights verify": Case([PY, "-m", "weights.cli", "verify", "model", "--lock", "weights.lock"],
                           "OK org/tiny"),
    "weights size": Case([PY, "-m", "weights.cli", "size", str(CONFIGS / "llama-3.1-8b.json"),
                          "--estimate", "--context", "8192", "--gpu-mem", "80GiB"], "fits"),
    "weights plan": Case([PY, "-m", "weights.cli", "plan", str(CONFIGS / "llama-3-70b.json"),
                          "--estimate"], "What to run: vllm serve"),
    "airgap pack": Case([PY, "-m", "airgap.cli", "pack", "--lock", "weights.lock", "--key",
                         "akey", "--from", "model", "--out", "b2"], "packed 3 files",
                        prepare=_rm("b2")),
    "airgap verify": Case([PY, "-m", "airgap.cli", "verify", "bundle", "--public-key",
                           "akey.pub"], "OK bundle"),
    "airgap verify (tampered)": Case([PY, "-m", "airgap.cli", "verify", "bad", "--public-key",
                                      "akey.pub"], "", exit=1),
    "airgap unpack": Case([PY, "-m", "airgap.cli", "unpack", "bundle", "--public-key",
                           "akey.pub", "--into", "cache"], "written 2", prepare=_rm("cache")),
    "airgap inspect": Case([PY, "-m", "airgap.cli", "inspect", "bundle"], "payload"),
    "policy check": Case([PY, "-m", "policy.cli", "check", str(POLICY)], "4 rules"),
    "policy explain": Case([PY, "-m", "policy.cli", "explain", str(POLICY), "--key", "k1",
                            "--class", "confidential"], "vllm-eu-1"),
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model, its lock, both kinds of keys, a good bundle and a tampered one."""
    work = tmp_path_factory.mktemp("operator")
    model = work / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(os.urandom(3_000_000))
    (model / "config.json").write_text("{}")

    def ok(argv: list[str]) -> None:
        run = piped(argv, cwd=work)
        assert run.returncode == 0, run.stderr

    ok([PY, "-m", "weights.cli", "lock", "model", "--repo-id", "org/tiny", "--lock",
        "weights.lock"])
    ok([PY, "-m", "weights.cli", "keygen", "--out", "wkey.pem"])
    ok([PY, "-m", "airgap.cli", "keygen", "--out", "akey"])
    ok([PY, "-m", "airgap.cli", "pack", "--lock", "weights.lock", "--key", "akey", "--from",
        "model", "--out", "bundle"])
    shutil.copytree(work / "bundle", work / "bad")
    part = next((work / "bad").glob("payload.*"))
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 1
    part.write_bytes(bytes(data))
    return work


@pytest.mark.parametrize("name", list(CASES))
def test_on_an_80_column_terminal(name: str, work: Path) -> None:
    case = CASES[name]
    if case.prepare:
        case.prepare(work)
    run = on_terminal(case.argv, columns=80, cwd=work)
    lines = visible_lines(run.screen)
    shown = "\n".join(lines)
    assert run.returncode == case.exit, shown
    assert "Traceback" not in shown and "error [internal_error]" not in shown, shown
    assert case.result in shown, shown
    assert "…" not in shown, f"text cut at 80 columns:\n{shown}"
    wide = [line for line in lines if BOX & set(line) and len(line) > 80]
    assert not wide, "table wider than the terminal:\n" + "\n".join(wide)


@pytest.mark.parametrize("name", list(CASES))
def test_piped_the_result_is_on_stdout_and_plain(name: str, work: Path) -> None:
    case = CASES[name]
    if case.prepare:
        case.prepare(work)
    run = piped(case.argv, cwd=work)
    assert run.returncode == case.exit, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert case.result in run.stdout, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    assert "\x1b" not in run.stdout + run.stderr  # no colour, no progress redraws in a file
    assert "━" not in run.stderr  # no progress bar in a log
    wide = [line for line in run.stdout.splitlines() if BOX & set(line) and len(line) > 100]
    assert not wide, "table wider than 100 columns in a file:\n" + "\n".join(wide)


# Lines that are machine formats or commands to copy, kept whole on purpose: the piped file
# list of `airgap inspect` (tab-separated, full digests) and `weights plan`'s vllm command.
# A token longer than the line (org/name@COMMIT) is kept whole on a line of its own.
def _may_be_wide(line: str) -> bool:
    return ("\t" in line or line.startswith("What to run: vllm serve")
            or " " not in line.strip())


WORDS_KEPT_WHOLE = {
    "policy check": ["10.0.2.5/32:5432", "10.0.0.11/32:8000", "jurisdiction EU; tags "
                     "no-retention", "tags no-training"],
    "weights plan": ["config.json:num_hidden_layers", "config.json:num_key_value_heads"],
    "airgap inspect": ["licence unknown", "each part at most 4 GiB - 1 byte"],
    "weights lock": ["licence unknown"],
}


@pytest.mark.parametrize("name", list(WORDS_KEPT_WHOLE))
def test_every_line_fits_80_columns_and_words_are_whole(name: str, work: Path) -> None:
    """A new operator's walk: piped and on an 80-column terminal, no line is wider than 80
    (a 125-column rule line with ``require_tags=['no-retention']``, a 299-column ``why:``, an
    address split as ``10.0.2.5/32:543`` / ``2``), words wrap whole, lists read as words."""
    case = CASES[name]
    for mode in ("piped", "terminal"):
        if case.prepare:
            case.prepare(work)
        if mode == "piped":
            run = piped(case.argv, cwd=work)
            lines, rc = run.stdout.splitlines(), run.returncode
        else:
            term = on_terminal(case.argv, columns=80, cwd=work)
            lines, rc = visible_lines(term.screen), term.returncode
        text = "\n".join(lines)
        assert rc == 0, text
        wide = [line for line in lines if len(line) > 80 and not _may_be_wide(line)]
        assert not wide, f"{mode}: lines wider than 80 columns:\n" + "\n".join(wide)
        assert "['" not in text and "None" not in text, text
        words = " ".join(text.split())  # a phrase may wrap between words, never inside one
        for phrase in WORDS_KEPT_WHOLE[name]:
            assert phrase in words, f"{mode}: {phrase!r} split or missing:\n{text}"
