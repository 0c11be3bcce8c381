"""Config validation: every mistake is one line naming the key, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config.loader import load
from gateway.errors import ConfigError

BASE = """\
models:
  - name: m
    replicas: [{url: "%s"}]
"""


def _load_error(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "gateway.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load(path, {})
    return info.value.message


@pytest.mark.parametrize(
    ("url", "problem"),
    [("http://a:8000/v1", "must be the server root without /v1"),
     ("http://a:8000/v1/", "must be the server root without /v1"),
     ("http://a b:8000", "has an invalid host 'a b'"),
     ("http://a\\u0000b:8000", "has an invalid host")],
)
def test_replica_url_mistakes(tmp_path: Path, url: str, problem: str) -> None:
    msg = _load_error(tmp_path, BASE % url)
    assert f"models[0].replicas[0].url: {problem}" in msg, msg


@pytest.mark.parametrize("url", ["http://10.0.0.1:8000", "https://vllm.example:443",
                                 "http://[::1]:8000", "http://vllm_x.svc:8000/prefix"])
def test_good_replica_urls_still_load(tmp_path: Path, url: str) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(BASE % url, encoding="utf-8")
    assert load(path, {}).models[0].replicas[0].url == url


def test_health_path_must_be_absolute(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, BASE % "http://a:1" + "health: {path: health}\n")
    assert "health.path: must start with /" in msg, msg


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
@pytest.mark.parametrize("key", ["timeouts.idle_s", "timeouts.first_byte_s", "health.interval_s",
                                 "health.cooldown_s", "retries.max_retry_after_s"])
def test_durations_must_be_finite(tmp_path: Path, key: str, value: str) -> None:
    section, field = key.split(".")
    msg = _load_error(tmp_path, BASE % "http://a:1" + f"{section}: {{{field}: {value}}}\n")
    assert msg.startswith(f"{tmp_path / 'gateway.yaml'}:4: {key}: "), msg


def test_duplicate_yaml_key_is_refused_with_line(tmp_path: Path) -> None:
    text = BASE % "http://a:1" + "listen: {port: 1}\nlisten: {port: 2}\n"
    msg = _load_error(tmp_path, text)
    assert msg == f"{tmp_path / 'gateway.yaml'}:5: listen: duplicate key 'listen'", msg


def test_nested_duplicate_yaml_key(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, "models:\n  - name: m\n    name: n\n    replicas: []\n")
    assert msg == f"{tmp_path / 'gateway.yaml'}:3: models[0].name: duplicate key 'name'", msg


def test_self_referencing_yaml(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, BASE % "http://a:1" + "x: &a [*a]\n")
    assert "refers to itself or nests too deeply" in msg, msg


def test_not_utf8(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, b"\xff\xfemodels: []\n")
    assert msg == f"{tmp_path / 'gateway.yaml'}: not UTF-8 text (byte 0)", msg


@pytest.mark.parametrize(
    "content", [b"\xff\xfe", b"x: &a [*a]\n", b"a: 1\na: 2\n"]
)
def test_check_config_cli_is_one_line_exit_1(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_bytes(content)
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", "--config", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "unexpected error" not in proc.stderr, proc.stderr
    assert str(path) in proc.stderr


def test_audit_files_are_relative_to_the_config_file(tmp_path: Path) -> None:
    """Like every other relative path in the config (api_key_file, TLS files, policy.file)."""
    conf = tmp_path / "etc"
    conf.mkdir()
    path = conf / "gateway.yaml"
    path.write_text(BASE % "http://a:1" + "audit: {enabled: true, signing_key_file: audit.key,"
                    " pseudonym_key_file: keys/p.key, checkpoint_dir: cps, store_file: url,"
                    " store: 'sqlite:///var/x.db'}\n", encoding="utf-8")
    audit = load(path, {}).audit
    assert audit is not None
    assert audit.signing_key_file == conf / "audit.key"
    assert audit.pseudonym_key_file == conf / "keys/p.key"
    assert audit.checkpoint_dir == conf / "cps"
    assert audit.store_file == conf / "url"
    assert audit.store == "sqlite:///var/x.db"


def test_check_config_from_another_directory(tmp_path: Path) -> None:
    conf = tmp_path / "etc"
    conf.mkdir()
    subprocess.run([sys.executable, "-m", "gateway.cli", "audit", "keygen", "--out",
                    str(conf / "audit.key"), "--pseudonym-key", str(conf / "p.key")],
                   check=True, capture_output=True, timeout=60)
    path = conf / "gateway.yaml"
    path.write_text(BASE % "http://a:1" + "audit: {enabled: true, signing_key_file: audit.key,"
                    f" pseudonym_key_file: p.key, store: 'sqlite://{tmp_path}/a.db'}}\n",
                    encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "gateway.cli", "check-config", "--config",
                           str(path)], capture_output=True, text=True, timeout=60, check=False,
                          cwd="/")
    assert proc.returncode == 0, proc.stderr
