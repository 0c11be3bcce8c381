"""Configuration problems: typed sections, one line per problem as ``file:line: key: problem``.

Every section (``policy``, ``audit``, ``quotas``, ``keystore``, ``telemetry`` as well as the core
ones) is validated once when the file is loaded; every problem, from validation or from the
checks ``check-config`` runs afterwards (policy binding, TLS and audit key files), is one line
naming file, line and key; ``--json`` lists them as objects; relative paths of every section are
relative to the config file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.audit.settings import AuditSettings
from gateway.config.errors import InvalidConfig
from gateway.config.loader import load
from gateway.egress_settings import PolicySettings
from gateway.keystore.settings import KeystoreSettings
from gateway.quotas.settings import QuotaSettings
from gateway.telemetry.settings import TelemetrySettings

REPO = Path(__file__).resolve().parents[2]

BAD = """\
listen: {host: 127.0.0.1, port: 8080}
models:
  - name: m
    replicas:
      - {url: "ftp://a"}
      - {url: "http://b:1/v1"}
audit:
  store: mysql://x
quotas:
  defaults:
    key: {requests_per_minute: 0}
telemetry:
  otlp_endpoint: http://collector:4318
keystore: {refresh_s: 0}
"""

EXPECTED = [
    (5, "models[0].replicas[0].url", "must be an http:// or https:// URL"),
    (6, "models[0].replicas[1].url", "must be the server root without /v1"),
    (8, "audit.store", "store must be sqlite:///PATH or postgresql://"),
    (11, "quotas.defaults.key.requests_per_minute", "Input should be greater than or equal to 1"),
    (12, "telemetry.otlp_endpoint_destination", "required with otlp_endpoint"),  # its section
    (14, "keystore.refresh_s", "Input should be greater than 0"),
]


def _check(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", *args, "--config", str(path)],
        capture_output=True, text=True, timeout=120, check=False, cwd=path.parent,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_every_problem_is_one_line_with_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(BAD, encoding="utf-8")
    proc = _check(path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == len(EXPECTED), proc.stderr
    # in the order of the file (validation found telemetry's after keystore's)
    assert [_line_no(line) for line in lines] == [n for n, _, _ in EXPECTED], proc.stderr
    for line, (number, key, problem) in zip(lines, EXPECTED, strict=True):
        assert line.startswith(f"{path}:{number}: {key}: {problem}"), (line, number, key)


def _line_no(text: str) -> int:
    match = re.match(r"^.*?:(\d+): ", text)
    assert match is not None, text
    return int(match[1])


def test_json_lists_problems_as_objects(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(BAD, encoding="utf-8")
    proc = _check(path, "--json")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["ok"] is False and out["file"] == str(path)
    got = [(p["line"], p["key"]) for p in out["problems"]]  # in the order of the file
    assert got == [(n, k) for n, k, _ in EXPECTED]
    for problem in out["problems"]:
        assert set(problem) == {"file", "line", "key", "problem"}
        assert problem["file"] == str(path)


def test_problems_found_after_loading_carry_their_line(tmp_path: Path) -> None:
    """The policy binding is checked on loaded settings; its problem still names the line."""
    (tmp_path / "policy.yaml").write_text(
        (REPO / "examples" / "policy.yaml").read_text(encoding="utf-8"), encoding="utf-8")
    path = tmp_path / "gateway.yaml"
    path.write_text("models:\n  - name: m\n    replicas:\n"
                    "      - {url: 'http://10.0.0.11:8000', destination: vllm-eu-1}\n"
                    "      - {url: 'http://10.9.9.9:8000', destination: vllm-eu-2}\n"
                    "policy: {file: policy.yaml}\n", encoding="utf-8")
    proc = _check(path, "--json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [problem] = json.loads(proc.stdout)["problems"]
    assert (problem["line"], problem["key"]) == (5, "models[0].replicas[1].destination")


def test_sections_are_typed_and_paths_relative_to_the_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "etc"
    conf.mkdir()
    path = conf / "gateway.yaml"
    path.write_text(
        "models: [{name: m, replicas: [{url: 'http://127.0.0.1:9'}]}]\n"
        "policy: {file: policies/p.yaml, guard: monitor}\n"
        "audit: {store: 'sqlite:///var/a.db', signing_key_file: k/sign.key}\n"
        "quotas: {tokenizers: {m: tok/m}}\n"
        "keystore: {refresh_s: 5}\n"
        "telemetry: {sample_ratio: 0.5}\n", encoding="utf-8")
    s = load(path, {})
    assert isinstance(s.policy, PolicySettings) and s.policy.file == conf / "policies/p.yaml"
    assert isinstance(s.audit, AuditSettings) and s.audit.signing_key_file == conf / "k/sign.key"
    assert s.audit.store == "sqlite:///var/a.db"  # a URL keeps its documented meaning
    assert isinstance(s.quotas, QuotaSettings) and s.quotas.tokenizers == {"m": conf / "tok/m"}
    assert isinstance(s.keystore, KeystoreSettings) and s.keystore.refresh_s == 5
    assert isinstance(s.telemetry, TelemetrySettings) and s.telemetry.sample_ratio == 0.5


def test_keystore_without_any_store_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text("models: [{name: m, replicas: [{url: 'http://127.0.0.1:9'}]}]\n"
                    "keystore: {enabled: true}\n", encoding="utf-8")
    with pytest.raises(InvalidConfig) as info:
        load(path, {})
    [problem] = info.value.problems
    assert (problem.line, problem.key) == (2, "keystore.store")


def test_one_formatter_of_validation_errors() -> None:
    """Only gateway/config/errors.py turns pydantic errors into messages (gateway/app.py maps
    request validation errors of the HTTP API, not configuration)."""
    allowed = {"gateway/config/errors.py", "gateway/app.py"}
    offenders = [
        f"{module.relative_to(REPO)}:{number}: {line.strip()}"
        for module in sorted((REPO / "gateway").rglob("*.py"))
        if str(module.relative_to(REPO)) not in allowed
        for number, line in enumerate(module.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\.errors\(\)|\[[\"']loc[\"']\]", line)
    ]
    assert offenders == []
