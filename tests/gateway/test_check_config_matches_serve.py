"""``gateway check-config`` catches what ``gateway serve`` would fail on, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BASE = """\
listen: {host: 127.0.0.1, port: 0%s}
models:
  - name: m
    replicas: [{url: "http://127.0.0.1:9"}]
"""
TLS = ", tls_cert_file: cert.pem, tls_key_file: key.pem"


def _run(
    tmp_path: Path, command: str, text: str, extra: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "gateway.yaml"
    path.write_text(text, encoding="utf-8")
    args = [command, "--config", str(path), *(extra or [])]
    environ = {k: v for k, v in os.environ.items() if k != "SG_WORKERS"}
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True,
        timeout=60, check=False, cwd=tmp_path,
        env={**environ, "NO_COLOR": "1", **(env or {})},
    )


CASES = [
    ("", "audit: {enabled: true, store: 'mysql://x', signing_key_file: k, pseudonym_key_file: p}",
     "audit.store: store must be sqlite:///PATH or postgresql://"),
    ("", "audit: {enabled: true, store: 'sqlite:///tmp/x.db', signing_key_file: nokey,"
     " pseudonym_key_file: p}", "audit.signing_key_file: cannot read signing key"),
    ("", "audit: {enabled: true, bogus: 1}",
     "audit.bogus: unknown key (known here: enabled, store, store_file,"),
    (TLS, "", "listen.tls_cert_file: cannot read {tmp}/cert.pem: No such file or directory"),
    ("", "upstream_tls: {ca_file: ca.pem}",
     "upstream_tls.ca_file: cannot read {tmp}/ca.pem: No such file or directory"),
]


@pytest.mark.parametrize(("listen", "extra", "problem"), CASES)
def test_check_config_refuses_what_serve_refuses(
    tmp_path: Path, listen: str, extra: str, problem: str
) -> None:
    text = BASE % listen + extra + "\n"
    check, serve = _run(tmp_path, "check-config", text), _run(tmp_path, "serve", text)
    want = problem.replace("{tmp}", str(tmp_path))
    assert check.returncode == 1, check.stderr
    assert want in check.stderr, check.stderr
    assert len(check.stderr.strip().splitlines()) == 1, check.stderr
    assert serve.returncode == 2, serve.stderr
    assert want in serve.stderr, serve.stderr
    assert "unexpected error" not in serve.stderr and "Traceback" not in serve.stderr
    assert len(serve.stderr.strip().splitlines()) == 1, serve.stderr


def test_mismatched_listen_key_named(tmp_path: Path) -> None:
    (tmp_path / "cert.pem").write_text("not a certificate\n", encoding="utf-8")
    (tmp_path / "key.pem").write_text("not a key\n", encoding="utf-8")
    proc = _run(tmp_path, "check-config", BASE % TLS)
    assert proc.returncode == 1
    assert (f"listen: tls_cert_file {tmp_path}/cert.pem and tls_key_file {tmp_path}/key.pem "
            "are not a matching PEM certificate and private key") in proc.stderr, proc.stderr


FLOW_IN_FLIGHT_1 = """\
flow_control:
  enabled: true
  classes: [{name: only, max_queue: 10, max_wait_s: 5}]
  default_class: only
  saturation: {in_flight: 1}
"""
MEMORY_QUOTAS = "quotas: {enabled: true, backend: memory}\n"


_FLOW = (FLOW_IN_FLIGHT_1, "in_flight: 1",
         "flow_control.saturation.in_flight: 1 is less than --workers 2")
_MEMORY = (MEMORY_QUOTAS, "backend: memory", "quotas.backend: memory keeps quota state inside one")
# How N is given and what is refused are independent: the fast lane runs the diagonal (each
# problem once, each way once; ~13 s each in CI), make test the whole cross product.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize(("extra", "marker", "problem", "how"), [
    pytest.param(*_FLOW, "option", id="option-flow"),
    pytest.param(*_MEMORY, "env", id="env-memory"),
    pytest.param(*_FLOW, "env", id="env-flow", marks=_SLOW),
    pytest.param(*_MEMORY, "option", id="option-memory", marks=_SLOW),
])
def test_check_config_workers_refuses_what_serve_workers_refuses(
    tmp_path: Path, extra: str, marker: str, problem: str, how: str
) -> None:
    """``check-config --workers N`` (or ``SG_WORKERS``) refuses, with file and line, what
    ``serve --workers N`` refuses; without it the file is valid for one process."""
    text = BASE % "" + extra
    args, env = (["--workers", "2"], {}) if how == "option" else ([], {"SG_WORKERS": "2"})
    check = _run(tmp_path, "check-config", text, args, env)
    serve = _run(tmp_path, "serve", text, args, env)
    single = _run(tmp_path, "check-config", text, [], {"SG_WORKERS": "1"})
    assert single.returncode == 0, single.stderr
    assert check.returncode == 1, check.stdout + check.stderr
    assert serve.returncode == 2, serve.stderr
    line = next(n for n, text_line in enumerate(text.splitlines(), 1)
                if marker in text_line)
    assert f"gateway.yaml:{line}: {problem}" in check.stderr, check.stderr
    assert len(check.stderr.strip().splitlines()) == 1, check.stderr
    assert problem in serve.stderr, serve.stderr
