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


def _run(tmp_path: Path, command: str, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "gateway.yaml"
    path.write_text(text, encoding="utf-8")
    args = [command, "--config", str(path)]
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True,
        timeout=60, check=False, cwd=tmp_path, env={**os.environ, "NO_COLOR": "1"},
    )


CASES = [
    ("", "audit: {enabled: true, store: 'mysql://x', signing_key_file: k, pseudonym_key_file: p}",
     "audit.store: store must be sqlite:///PATH or postgresql://"),
    ("", "audit: {enabled: true, store: 'sqlite:///tmp/x.db', signing_key_file: nokey,"
     " pseudonym_key_file: p}", "audit: cannot read signing key"),
    ("", "audit: {enabled: true, bogus: 1}", "audit.bogus: Extra inputs are not permitted"),
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
