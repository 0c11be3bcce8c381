"""Every URL path in the configuration must be an RFC 3986 absolute path.

``health.path`` and ``routing.metrics_path`` are appended to replica URLs and sent as request
targets; a space or other character invalid there is refused when the file is loaded, with
``file:line: key: problem``, by ``load`` and by ``gateway check-config``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config.loader import load
from gateway.config.url_paths import url_path_problem
from gateway.errors import ConfigError

BASE = """\
models:
  - name: m
    replicas: [{url: "http://a:1"}]
"""

# (section line written after BASE, the key it sets, the line number of that key)
KEYS = {
    "health.path": ("health:\n  interval_s: 5\n  path: {value}\n", 6),
    "routing.metrics_path": ("routing:\n  metrics_path: {value}\n", 5),
}

BAD = {
    "'/h ealth'": "' ' at position 2 is not allowed in a URL path",
    "'/health#x'": "'#' at position 7: a query or fragment is not part of a URL path",
    "'/health?ready=1'": "'?' at position 7: a query or fragment",
    "'/bad%zz'": "'%' at position 4 is not followed by two hex digits",
    "'/caf\u00e9'": "'\u00e9' at position 4 is not allowed in a URL path",
    "'/tab\there'": "'\\t' at position 4 is not allowed",
    "'/back\\\\slash'": "'\\\\' at position 5 is not allowed",
    "'/quote\"d'": "'\"' at position 6 is not allowed",
    "health": "must start with /",
    "''": "must start with /",
}

GOOD = ["/health", "/", "/v1/health/", "/a%20b", "/metrics;v=1", "/x:y@z/~a_b.c-d!$&'()*+,="]


def _write(tmp_path: Path, key: str, value: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(BASE + KEYS[key][0].format(value=value), encoding="utf-8")
    return path


@pytest.mark.parametrize("value", sorted(BAD))
@pytest.mark.parametrize("key", sorted(KEYS))
def test_invalid_url_path_names_file_line_and_key(tmp_path: Path, key: str, value: str) -> None:
    path = _write(tmp_path, key, value)
    with pytest.raises(ConfigError) as info:
        load(path, {})
    assert info.value.message.startswith(f"{path}:{KEYS[key][1]}: {key}: {BAD[value]}"), (
        info.value.message)


@pytest.mark.parametrize("value", GOOD)
@pytest.mark.parametrize("key", sorted(KEYS))
def test_valid_url_paths_load(tmp_path: Path, key: str, value: str) -> None:
    settings = load(_write(tmp_path, key, json.dumps(value)), {})
    section, name = key.split(".")
    assert getattr(getattr(settings, section), name) == value
    assert url_path_problem(value) is None


def test_check_config_refuses_a_space_in_health_path(tmp_path: Path) -> None:
    path = _write(tmp_path, "health.path", "'/h ealth'")
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "check-config", "--config", str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert f"{path}:6: health.path: ' ' at position 2 is not allowed" in proc.stderr, proc.stderr
