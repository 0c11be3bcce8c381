"""The one CLI shell: ``gateway``, ``policy``, ``weights`` and ``airgap`` behave alike.

The same ``--version``; one error line ``PROG: error [CODE]: WHAT (hint: ...)`` with the same
exit codes; ``-v``/``--verbose`` in any position shows the traceback; help without Python type
names (``vllm-sim`` too); one key file naming scheme (``KEY.pem``/``KEY.pub``, the old
``KEY.pub.pem`` still found with a warning); the config file given to every command that reads
it the same way (``--config``, ``-c`` or ``SG_CONFIG``). Interrupted commands:
``test_interrupted_long_running.py``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import airgap.cli
import gateway.cli
import policy.cli
import vllm_sim.cli
import weights.cli
from clishell import VERSION, click_command, existing_public_key, public_key_path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gateway.yaml"
# The simulator's command line is the same shell (help, --version, error line) but not a product
# CLI: it is tested where it fits (no subcommands, no verification, no key files).
MAINS: dict[str, Callable[[list[str] | None], int]] = {
    "gateway": gateway.cli.main, "policy": policy.cli.main,
    "weights": weights.cli.main, "airgap": airgap.cli.main, "vllm-sim": vllm_sim.cli.main,
}
APPS: dict[str, Any] = {"gateway": gateway.cli.app, "policy": policy.cli.app,
                        "weights": weights.cli.app, "airgap": airgap.cli.app,
                        "vllm-sim": vllm_sim.cli.app}
PROGS = ("gateway", "policy", "weights", "airgap")
ERROR_LINE = re.compile(r"^(?P<prog>[a-z]+): error \[(?P<code>[a-z_]+)\]: (?P<what>.+?)"
                        r"(?: \(hint: (?P<hint>.+)\))?$")


def _bad_input(prog: str, tmp: Path) -> tuple[list[str], str, int]:
    """A command line of ``prog`` that fails on bad input: (argv, error code, exit status)."""
    missing = tmp / "missing"
    return {
        "gateway": (["serve", "--config", str(missing / "gateway.yaml")], "config_error", 2),
        "policy": (["check", str(missing / "policy.yaml")], "policy_unreadable", 2),
        "weights": (["verify", str(tmp), "--lock", str(missing / "weights.lock")],
                    "lockfile_invalid", 2),
        "airgap": (["inspect", str(missing / "bundle")], "bundle_not_found", 2),
    }[prog]


def _failed_verification(prog: str, tmp: Path) -> tuple[list[str], str]:
    """A command line of ``prog`` whose verification fails (exit 1): (argv, error code)."""
    if prog == "gateway":
        proof = tmp / "proof.json"
        proof.write_text('{"format": "not a proof"}')
        key = tmp / "audit.key"
        assert MAINS["gateway"](["audit", "keygen", "--out", str(key)]) == 0
        return ["audit", "verify-proof", str(proof), "--public-key", str(key) + ".pub"], ""
    if prog == "policy":
        bad = tmp / "policy.yaml"
        bad.write_text("version: 1\nrules: [{id: r, effect: maybe}]\n")
        return ["check", str(bad)], "invalid_policy"
    if prog == "weights":
        model, lock = tmp / "model", tmp / "weights.lock"
        model.mkdir()
        (model / "config.json").write_text("{}")
        (model / "model.safetensors").write_bytes(b"x" * 64)
        assert MAINS["weights"](["lock", str(model), "--repo-id", "org/m", "--lock",
                                 str(lock), "-q"]) == 0
        (model / "model.safetensors").write_bytes(b"y" * 64)
        return ["verify", str(model), "--lock", str(lock), "-q"], ""
    bundle = tmp / "bundle"
    bundle.mkdir()
    key = tmp / "k.pem"
    assert MAINS["airgap"](["keygen", "--out", str(key)]) == 0
    return ["unpack", str(bundle), "-k", str(public_key_path(key)), "--into",
            str(tmp / "store")], "index_missing"


def _run(capsys: pytest.CaptureFixture[str], prog: str, argv: list[str]) -> tuple[int, str, str]:
    rc = MAINS[prog](argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_the_version_is_the_projects() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert VERSION == project["version"]
    assert VERSION == airgap.__version__


@pytest.mark.parametrize("prog", PROGS)
def test_version_from_the_console_script_is_the_same_for_every_cli(prog: str) -> None:
    script = Path(sys.executable).parent / prog
    for argv in (["--version"], [_a_command(prog), "--version"]):
        proc = subprocess.run([str(script), *argv], capture_output=True, text=True,
                              timeout=60, check=False)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"{prog} {VERSION}\n", "")


def _a_command(prog: str) -> str:
    return {"gateway": "serve", "policy": "check", "weights": "verify", "airgap": "verify"}[prog]


@pytest.mark.parametrize("prog", PROGS)
def test_bad_input_is_one_error_line_and_exit_2(
        prog: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv, code, status = _bad_input(prog, tmp_path)
    rc, out, err = _run(capsys, prog, argv)
    assert rc == status
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    match = ERROR_LINE.match(lines[0])
    assert match is not None, err
    assert (match["prog"], match["code"]) == (prog, code)
    assert "missing" in match["what"]  # says where
    assert "Traceback" not in err


@pytest.mark.parametrize("prog", PROGS)
def test_a_failed_verification_exits_1(
        prog: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv, code = _failed_verification(prog, tmp_path)
    capsys.readouterr()
    rc, _, err = _run(capsys, prog, argv)
    assert rc == 1, err
    if code:  # a verification that fails with an error (others print their own report)
        first = ERROR_LINE.match(err.splitlines()[0])
        assert first is not None and (first["prog"], first["code"]) == (prog, code), err


@pytest.mark.parametrize("prog", PROGS)
def test_a_usage_error_is_one_error_line_with_a_help_hint(
        prog: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, prog, ["no-such-command"])
    assert rc == 2 and out == ""
    match = ERROR_LINE.match(err.strip())
    assert match is not None, err
    assert (match["prog"], match["code"], match["hint"]) == (prog, "usage_error",
                                                             f"see '{prog} --help'")
    assert "no-such-command" in match["what"]


@pytest.mark.parametrize("prog", PROGS)
@pytest.mark.parametrize("flag", ["-v", "--verbose"])
@pytest.mark.parametrize("where", ["first", "last"])
def test_verbose_in_any_position_shows_the_traceback(
        prog: str, flag: str, where: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    argv, code, status = _bad_input(prog, tmp_path)
    argv = [flag, *argv] if where == "first" else [*argv, flag]
    rc, _, err = _run(capsys, prog, argv)
    assert rc == status
    assert err.startswith("Traceback (most recent call last):"), err
    last = ERROR_LINE.match(err.splitlines()[-1])
    assert last is not None and last["code"] == code, err


@pytest.mark.parametrize("prog", PROGS)
def test_json_failure_is_one_document_on_stdout(
        prog: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    argv, code, status = _bad_input(prog, tmp_path)
    rc, out, err = _run(capsys, prog, [*argv, "--json"])
    if rc == 2 and "usage_error" in err:  # this command has no --json: typer refuses it
        return
    assert rc == status
    doc = json.loads(out)
    assert doc["ok"] is False and doc["error"]["code"] == code


def _commands(command: Any, path: list[str]) -> Iterator[list[str]]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, [*path, name])


PYTHON_TYPES = re.compile(r"<class|Optional\[|Union\[|typing\.|NoneType|PosixPath|\bpathlib\b|"
                          r"\[str\]|\[Path\]|<str>|<int>|<float>|<bool>|<path>|<Path>|"
                          r"\bstr \| None|\bPath \| None")


@pytest.mark.parametrize("prog", [*PROGS, "vllm-sim"])
def test_help_has_no_python_type_names(
        prog: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    paths = list(_commands(click_command(APPS[prog]), []))
    assert len(paths) == 1 if prog == "vllm-sim" else len(paths) > 3  # subcommands found
    for path in paths:
        rc, out, err = _run(capsys, prog, [*path, "--help"])
        assert rc == 0, (path, err)
        assert "Usage:" in out
        leaked = [line for line in out.splitlines() if PYTHON_TYPES.search(line)]
        assert leaked == [], (path, leaked)
    _, out, _ = _run(capsys, prog, ["--help"])
    assert "--version" in out and "--verbose" in out and "-v" in out


def test_every_keygen_names_the_public_key_key_pub(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert MAINS["weights"](["keygen", "--out", str(tmp_path / "model-signing.pem")]) == 0
    assert MAINS["airgap"](["keygen", "--out", str(tmp_path / "site-signing.pem")]) == 0
    assert MAINS["gateway"](["audit", "keygen", "--out", str(tmp_path / "audit.key")]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "audit.key", "audit.key.pub", "model-signing.pem", "model-signing.pub",
        "site-signing.pem", "site-signing.pub"]
    assert (tmp_path / "site-signing.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert public_key_path(tmp_path / "a.pem") == tmp_path / "a.pub"
    assert public_key_path(tmp_path / "audit.key") == tmp_path / "audit.key.pub"


def test_an_old_public_key_name_is_found_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    legacy = tmp_path / "site.pub.pem"
    legacy.write_text("old")
    assert existing_public_key(tmp_path / "site.pub", "airgap") == legacy
    warning = capsys.readouterr().err
    assert warning.startswith(f"airgap: warning [deprecated]: {tmp_path / 'site.pub'} not found;")
    assert "(hint: rename it to site.pub)" in warning
    new = tmp_path / "other.pub"
    new.write_text("new")
    assert existing_public_key(tmp_path / "other.pub.pem", "weights") == new
    assert "weights: warning [deprecated]" in capsys.readouterr().err
    assert existing_public_key(new, "weights") == new  # the name given exists: no warning
    assert existing_public_key(tmp_path / "none.pub", "weights") == tmp_path / "none.pub"
    assert capsys.readouterr().err == ""


def test_an_airgap_bundle_verifies_with_the_old_public_key_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key = tmp_path / "site.pem"
    assert MAINS["airgap"](["keygen", "--out", str(key)]) == 0
    (tmp_path / "site.pub").rename(tmp_path / "site.pub.pem")  # as an older keygen wrote it
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    capsys.readouterr()
    rc, _, err = _run(capsys, "airgap", ["verify", str(bundle), "-k", str(tmp_path / "site.pub")])
    lines = err.splitlines()
    assert lines[0].startswith("airgap: warning [deprecated]: ")
    # The key was read (the empty bundle is what fails, not the key).
    assert rc == 1 and "FAIL index_missing" in lines[1], err


@pytest.mark.parametrize("how", ["--config", "-c", "SG_CONFIG"])
def test_check_config_takes_the_config_as_serve_does(
        how: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    monkeypatch.setenv("VLLM_KEY", "x")
    monkeypatch.delenv("SG_CONFIG", raising=False)
    missing = tmp_path / "missing.yaml"
    for command in ("check-config", "serve"):
        path = EXAMPLE if command == "check-config" else missing
        if how == "SG_CONFIG":
            monkeypatch.setenv("SG_CONFIG", str(path))
            argv = [command]
        else:
            argv = [command, how, str(path)]
        rc, out, err = _run(capsys, "gateway", argv)
        if command == "check-config":
            assert (rc, err) == (0, "") and f"{EXAMPLE}: OK" in out
        else:  # serve read the same option and failed on the file before serving
            assert rc == 2 and err.startswith(f"gateway: error [config_error]: cannot read "
                                              f"config file {missing}"), err


def test_check_config_positional_file_still_works_with_a_warning(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_KEY", "x")
    rc, out, err = _run(capsys, "gateway", ["check-config", str(EXAMPLE)])
    assert rc == 0 and f"{EXAMPLE}: OK" in out
    assert err == (f"gateway: warning [deprecated]: check-config FILE (the config file as an "
                   f"argument) (hint: use check-config --config {EXAMPLE}, as for serve)\n")


def test_check_config_without_a_config_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SG_CONFIG", raising=False)
    rc, _, err = _run(capsys, "gateway", ["check-config"])
    assert rc == 2
    assert err.startswith("gateway: error [usage_error]: no config file given (hint: pass "
                          "--config FILE")


def _config_commands() -> list[tuple[str, list[str], Any]]:
    """Every command of every CLI with a ``--config`` option: (prog, path, the option)."""
    found = []
    for prog, app in APPS.items():
        for path in _commands(click_command(app), []):
            command = click_command(app)
            for name in path:
                command = command.commands[name]
            for param in command.params:
                if "--config" in getattr(param, "opts", ()):
                    found.append((prog, path, param))
    return found


# A command line of each command that reads --config, with what else it needs.
CONFIG_READERS = {
    ("gateway", "serve"): [], ("gateway", "check-config"): [], ("gateway", "preflight"): [],
    ("gateway", "audit verify"): [], ("gateway", "audit export"): [],
    ("gateway", "audit tail"): [], ("gateway", "audit prove"): ["req-1"],
    ("gateway", "keys create"): ["--id", "k", "--model", "m"], ("gateway", "keys list"): [],
    ("gateway", "keys revoke"): ["k"], ("gateway", "keys rotate"): ["k"],
    ("gateway", "identity explain"): ["--claims", "claims.json"],
    ("gateway", "audit timeline"): ["--trace-id", "0" * 32],
    ("policy", "explain"): [str(ROOT / "examples" / "policy.yaml"), "--key", "team-a"],
}


def test_every_config_option_is_the_shared_one() -> None:
    found = _config_commands()
    assert {(prog, " ".join(path)) for prog, path, _ in found} == set(CONFIG_READERS)
    for prog, path, param in found:
        assert (sorted(param.opts), param.envvar) == (["--config", "-c"], "SG_CONFIG"), (
            prog, path)


@pytest.mark.parametrize("how", ["--config", "-c", "SG_CONFIG"])
@pytest.mark.parametrize(("prog", "command"), sorted(CONFIG_READERS),
                         ids=[f"{p} {c}" for p, c in sorted(CONFIG_READERS)])
def test_every_command_reads_the_config_from_the_option_or_sg_config(
        prog: str, command: str, how: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "missing" / "gateway.yaml"
    argv = [*command.split(), *CONFIG_READERS[(prog, command)]]
    monkeypatch.delenv("SG_CONFIG", raising=False)
    if how == "SG_CONFIG":
        monkeypatch.setenv("SG_CONFIG", str(missing))
    else:
        argv += [how, str(missing)]
    rc, _, err = _run(capsys, prog, argv)
    # It read the option: it failed on that file (exit 2), naming it.
    assert rc == 2, err
    assert str(missing) in err, err

