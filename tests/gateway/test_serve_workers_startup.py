"""``gateway serve --workers N`` that cannot start ends like one process: exit 3 and one
``gateway: error [startup_failed]: ...`` line naming why, never a worker's traceback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def _serve(tmp_path: Path, port: int, audit_store: str | None = None) -> tuple[int, str]:
    from gateway.audit import Signer, generate_key_file, write_key_pair

    text = (f"listen: {{host: 127.0.0.1, port: {port}}}\n"
            "models:\n  - name: m\n    replicas: [{url: 'http://127.0.0.1:9'}]\n"
            "health: {active: false}\n")
    if audit_store is not None:
        key, _ = write_key_pair(Signer.generate(), tmp_path / "audit.key")
        pseudonym = generate_key_file(tmp_path / "pseudonym.key")
        text += (f"audit: {{store: '{audit_store}', signing_key_file: '{key}', "
                 f"pseudonym_key_file: '{pseudonym}'}}\n")
    path = tmp_path / "gateway.yaml"
    path.write_text(text, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--workers", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return proc.returncode, proc.stderr


def test_a_port_in_use_ends_with_the_startup_failed_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        status, stderr = _serve(tmp_path, taken.getsockname()[1])
    last = stderr.strip().splitlines()[-1]
    assert status == 3, stderr[-3000:]
    assert last.startswith("gateway: error [startup_failed]: the gateway did not start: "), last
    assert "Address already in use" in last
    assert "(hint: a port in use is listen.port or telemetry.admin.port" in last


def test_a_worker_that_cannot_open_its_store_names_why_without_a_traceback(
    tmp_path: Path,
) -> None:
    # A directory where the database file should be: the config check passes (a missing
    # directory is refused before the workers' lifespan, as `audit.store` with its line), the
    # store cannot be opened.
    (tmp_path / "audit.db").mkdir()
    store = f"sqlite://{tmp_path}/audit.db"
    status, stderr = _serve(tmp_path, free_port(), audit_store=store)
    lines = stderr.strip().splitlines()
    assert status == 3, stderr[-3000:]
    assert "Process gateway-worker" not in stderr, stderr[-3000:]  # multiprocessing's traceback
    assert any(line.startswith("gateway: error [startup_failed]: worker ")
               and f"cannot open audit store {store}" in line for line in lines), stderr[-3000:]
    assert lines[-1].startswith("gateway: error [startup_failed]: the gateway did not start: "
                                "worker "), lines[-1]
    assert "exited before it served (exit status 3)" in lines[-1]
    assert lines[-1].endswith("(hint: the worker's error line above says why)")


_RECORD_BINDS = """\
import sys
binds = []
# Bound addresses with a port: the listen and admin ports (a library's IPv6 probe binds port 0).
sys.addaudithook(lambda event, args: binds.append(repr(args[1]))
                 if event == "socket.bind" and isinstance(args[1], tuple) and args[1][1]
                 else None)
from gateway.cli import main
status = main(sys.argv[1:])
print("binds:", binds, file=sys.stderr)
sys.exit(status)
"""


def _refused_config(tmp_path: Path, port: int) -> Path:
    """A config the schema accepts and the assembly refuses: a replica outside its policy
    destination (what every worker would refuse)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\ndata_classes: [internal]\ndestinations:\n"
                      "  - {id: vllm, host: 10.0.0.1, port: 8000, region: eu-de-1, "
                      "jurisdiction: EU, operator: o}\n", encoding="utf-8")
    path = tmp_path / "gateway.yaml"
    path.write_text(f"listen: {{host: 127.0.0.1, port: {port}}}\n"
                    "models:\n  - name: m\n"
                    "    replicas: [{url: 'http://127.0.0.1:9', destination: vllm}]\n"
                    "health: {active: false}\n"
                    "policy: {file: policy.yaml, guard: 'off'}\n", encoding="utf-8")
    return path


def _serve_recording_binds(path: Path, *workers: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-c", _RECORD_BINDS, "serve", "--config", str(path), *workers],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return proc.returncode, proc.stderr


def test_a_refused_config_binds_no_socket_and_starts_no_worker(tmp_path: Path) -> None:
    """Refused as one process refuses it (same lines, exit 2), before any port is bound."""
    port = free_port()
    config = _refused_config(tmp_path, port)
    status, stderr = _serve_recording_binds(config, "--workers", "2")
    lines = stderr.strip().splitlines()
    assert status == 2, stderr[-3000:]
    assert lines[-1] == "binds: []", stderr[-3000:]  # not the port, nor the admin port
    assert "worker" not in stderr
    one_status, one_stderr = _serve_recording_binds(config)
    assert (status, lines) == (one_status, one_stderr.strip().splitlines())
    assert lines[0].startswith("gateway: error [destination_mismatch]: "
                               "models[0].replicas[0].destination: "), lines[0]
    with socket.socket() as again:  # the port is free after the refusal
        again.bind(("127.0.0.1", port))


def test_a_refused_config_is_named_even_when_the_port_is_in_use(tmp_path: Path) -> None:
    """The config's problem, not "Address already in use": the port is never tried."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        status, stderr = _serve_recording_binds(
            _refused_config(tmp_path, taken.getsockname()[1]), "--workers", "2")
    assert status == 2, stderr[-3000:]
    assert "models[0].replicas[0].destination: " in stderr
    assert "startup_failed" not in stderr and "Address already in use" not in stderr


def test_an_assembly_problem_is_refused_located_before_binding(tmp_path: Path) -> None:
    """A problem found by the assembly (a missing audit key file) is refused located in the
    file, as one process refuses it, before any port is bound."""
    port = free_port()
    path = tmp_path / "gateway.yaml"
    path.write_text(f"listen: {{host: 127.0.0.1, port: {port}}}\n"
                    "models:\n  - name: m\n    replicas: [{url: 'http://127.0.0.1:9'}]\n"
                    "health: {active: false}\n"
                    f"audit: {{store: 'sqlite://{tmp_path}/audit.db', "
                    f"signing_key_file: '{tmp_path}/missing.key', "
                    f"pseudonym_key_file: '{tmp_path}/missing-pseudonym.key'}}\n",
                    encoding="utf-8")
    status, stderr = _serve_recording_binds(path, "--workers", "2")
    lines = stderr.strip().splitlines()
    assert status == 2, stderr[-3000:]
    assert lines[-1] == "binds: []", stderr[-3000:]
    one_status, one_stderr = _serve_recording_binds(path)
    assert (status, lines) == (one_status, one_stderr.strip().splitlines())
    assert lines[0].startswith(f"gateway: error [config_error]: {path}:6: "
                               "audit.signing_key_file: cannot read signing key "), lines[0]
