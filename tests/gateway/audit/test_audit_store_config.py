"""The ``audit.store`` of a config file, as an operator writes it from the README.

* The README's example store (``sqlite:///var/lib/sovereign-gateway/audit.db``) on a machine
  without that directory: ``gateway check-config`` said OK, then ``gateway serve`` logged a
  traceback and ended with a hint about ports. Now both name ``audit.store`` with its line.
* A start-up failure of the store that the config check cannot foresee (the file is a
  directory) is logged as one line, not as Starlette's traceback, and the hint does not talk
  about ports.
* A relative ``sqlite://audit.db`` (and ``checkpoint_dir``) means the file next to the config,
  for ``gateway serve`` and for ``gateway audit ... --config`` alike, whatever the working
  directory: before, the store was opened in the working directory of each command, and
  ``gateway audit verify --config`` looked for the checkpoint directory there too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gateway.audit import Signer, generate_key_file, write_key_pair
from tests.conftest import free_port
from tests.gateway.helpers import BACKEND_KEY, Sim, config

ROOT = Path(__file__).parents[3]


def _gateway(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VLLM_KEY": BACKEND_KEY, "NO_COLOR": "1"}
    env.pop("SG_CONFIG", None)
    env.pop("SG_WORKERS", None)
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=90, check=False)


def _config_file(tmp_path: Path, sim_url: str, store: str, **audit: str) -> Path:
    """A config with an ``audit:`` section written as block YAML, ``store`` on its own line."""
    write_key_pair(Signer.generate(), tmp_path / "audit.key")
    generate_key_file(tmp_path / "pseudonym.key")
    cfg = config([sim_url], listen={"host": "127.0.0.1", "port": free_port()},
                 drain={"delay_s": 0, "timeout_s": 5})
    cfg["audit"] = {"store": store, "signing_key_file": "audit.key",
                    "pseudonym_key_file": "pseudonym.key", "checkpoint_every_s": 0.2, **audit}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg, default_flow_style=False, sort_keys=False))
    return path


def _line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_store_directory_that_does_not_exist_is_named_by_check_config_and_serve(
    sim: Sim, tmp_path: Path
) -> None:
    missing = tmp_path / "var" / "lib" / "sovereign-gateway"
    cfg = _config_file(tmp_path, sim.url, f"sqlite://{missing}/audit.db")
    line = _line_of(cfg, "store:")
    want = (f"gateway.yaml:{line}: audit.store: the directory of the SQLite file "
            f"{missing}/audit.db, {missing}, does not exist: create it")

    check = _gateway("check-config", "--config", str(cfg), cwd=tmp_path)
    assert check.returncode == 1, check.stdout + check.stderr
    assert want in check.stderr, check.stderr

    serve = _gateway("serve", "--config", str(cfg), cwd=tmp_path)
    assert serve.returncode == 2, serve.stderr[-2000:]
    last = serve.stderr.strip().splitlines()[-1]
    assert last.startswith("gateway: error [config_error]: ") and want in last, last
    assert "Traceback" not in serve.stderr
    assert not missing.exists()


def test_a_store_that_cannot_be_opened_is_one_log_line_and_a_hint_without_ports(
    sim: Sim, tmp_path: Path
) -> None:
    (tmp_path / "audit.db").mkdir()  # the directory exists; the "file" cannot be a database
    cfg = _config_file(tmp_path, sim.url, f"sqlite://{tmp_path}/audit.db")
    serve = _gateway("serve", "--config", str(cfg), cwd=tmp_path)
    assert serve.returncode == 3, serve.stderr[-2000:]
    assert "Traceback" not in serve.stderr, serve.stderr[-3000:]
    assert "AuditUnavailable: cannot open audit store" in serve.stderr
    last = serve.stderr.strip().splitlines()[-1]
    assert last.startswith("gateway: error [startup_failed]: the gateway did not start: "
                           "AuditUnavailable: cannot open audit store"), last
    assert "port" not in last.split("(hint:", 1)[1], last


def test_a_relative_store_and_checkpoint_dir_are_next_to_the_config(
    sim: Sim, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (site / "checkpoints").mkdir()
    cfg = _config_file(site, sim.url, "sqlite://audit.db", checkpoint_dir="checkpoints")
    env = {**os.environ, "VLLM_KEY": BACKEND_KEY}
    with subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config",
                           str(cfg)], cwd=elsewhere, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        deadline = time.monotonic() + 60
        while not any((site / "checkpoints").iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert (site / "audit.db").is_file()
    assert not (elsewhere / "audit.db").exists()
    verify = _gateway("audit", "verify", "--config", str(cfg), "--public-key",
                      str(site / "audit.key.pub"), cwd=elsewhere)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert f"store sqlite://{site}/audit.db: 1 chain(s)" in verify.stdout, verify.stdout


def test_a_wrong_key_file_is_named_at_its_own_key(sim: Sim, tmp_path: Path) -> None:
    """Key file problems were all ``audit: ...`` on the section's line; the public key given as
    the signing key said ``signing key must be PRIVATE+KEY+...``."""
    cfg = _config_file(tmp_path, sim.url, f"sqlite://{tmp_path}/audit.db")
    text = cfg.read_text().replace("signing_key_file: audit.key", "signing_key_file: audit.key.pub")
    cfg.write_text(text)
    check = _gateway("check-config", "--config", str(cfg), cwd=tmp_path)
    assert check.returncode == 1, check.stdout + check.stderr
    line = _line_of(cfg, "signing_key_file:")
    assert check.stderr.strip() == (
        f"{cfg}:{line}: audit.signing_key_file: {tmp_path}/audit.key.pub is a public (verifier) "
        f"key, not a signing key: give the private key keygen wrote next to it "
        f"({tmp_path}/audit.key)"), check.stderr
    cfg.write_text(text.replace("signing_key_file: audit.key.pub", "signing_key_file: audit.key")
                   .replace("pseudonym_key_file: pseudonym.key", "pseudonym_key_file: nope.key"))
    check = _gateway("check-config", "--config", str(cfg), cwd=tmp_path)
    line = _line_of(cfg, "pseudonym_key_file:")
    assert f"{cfg}:{line}: audit.pseudonym_key_file: " in check.stderr, check.stderr


def test_verify_with_a_config_checks_signatures_with_the_key_it_names(
    sim: Sim, tmp_path: Path
) -> None:
    """``gateway audit verify --config gateway.yaml`` said OK with signatures unchecked
    although the config names the signing key: it now checks them with ``KEY.pub`` next to
    ``audit.signing_key_file``, fails on a wrong one and refuses when it is missing."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "checkpoints").mkdir()
    cfg = _config_file(site, sim.url, "sqlite://audit.db", checkpoint_dir="checkpoints")
    env = {**os.environ, "VLLM_KEY": BACKEND_KEY}
    with subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config",
                           str(cfg)], cwd=site, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
        deadline = time.monotonic() + 60
        while not any((site / "checkpoints").iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint written"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    ok = _gateway("audit", "verify", "--config", str(cfg), cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "OK: no tampering found" in ok.stdout
    # Another key in its place: the signatures no longer verify.
    write_key_pair(Signer.generate(), tmp_path / "other.key")
    (site / "audit.key.pub").write_bytes((tmp_path / "other.key.pub").read_bytes())
    wrong = _gateway("audit", "verify", "--config", str(cfg), cwd=tmp_path)
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    (site / "audit.key.pub").unlink()
    missing = _gateway("audit", "verify", "--config", str(cfg), cwd=tmp_path)
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert "error [key_missing]" in missing.stderr and "audit.key.pub" in missing.stderr
    assert "--public-key" in missing.stderr
