"""``keys_file``: API key digests from their own YAML file (the Helm chart mounts a Secret)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from gateway.config.loader import load
from gateway.errors import ConfigError
from tests.gateway.helpers import (
    BACKEND_KEY,
    KEY_A,
    KEY_B,
    Clients,
    Sim,
    config,
    sha,
    start_gateway,
)

FILE_KEY = {"id": "team-file", "sha256": sha("sg-from-file"), "models": ["llama-3.1-8b"],
            "team": "f", "data_class": "confidential"}


def _write(tmp_path: Path, cfg: dict[str, Any], keys: Any, name: str = "keys.yaml") -> Path:
    (tmp_path / name).write_text(yaml.safe_dump(keys), encoding="utf-8")
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def test_keys_file_is_merged_with_inline_keys(tmp_path: Path) -> None:
    cfg = {**config(["http://127.0.0.1:9"]), "keys_file": "keys.yaml"}  # relative to the config
    settings = load(_write(tmp_path, cfg, [FILE_KEY]), {"VLLM_KEY": "x"})
    assert [k.id for k in settings.keys] == ["team-a", "team-b", "team-file"]
    assert settings.keys[2].data_class == "confidential"
    assert settings.keys[2].sha256 == sha("sg-from-file")


def test_keys_file_alone(tmp_path: Path) -> None:
    cfg = {k: v for k, v in config(["http://127.0.0.1:9"]).items() if k != "keys"}
    cfg["keys_file"] = str(tmp_path / "keys.yaml")
    settings = load(_write(tmp_path, cfg, [FILE_KEY]), {"VLLM_KEY": "x"})
    assert [k.id for k in settings.keys] == ["team-file"]


def _error(tmp_path: Path, keys: Any, **extra: Any) -> str:
    cfg = {**config(["http://127.0.0.1:9"]), "keys_file": "keys.yaml", **extra}
    with pytest.raises(ConfigError) as info:
        load(_write(tmp_path, cfg, keys), {"VLLM_KEY": "x"})
    return info.value.message


def test_duplicate_id_names_both_sources(tmp_path: Path) -> None:
    msg = _error(tmp_path, [{**FILE_KEY, "id": "team-a"}])
    assert f"keys_file ({tmp_path / 'keys.yaml'})[0].id: duplicate key id 'team-a' (also keys[0])" \
        in msg, msg


def test_duplicate_digest_names_both_sources(tmp_path: Path) -> None:
    msg = _error(tmp_path, [{**FILE_KEY, "sha256": sha(KEY_B)}])
    assert f"keys_file ({tmp_path / 'keys.yaml'})[0].sha256: same digest as keys[1]" in msg, msg


def test_duplicate_id_inside_the_file(tmp_path: Path) -> None:
    msg = _error(tmp_path, [FILE_KEY, FILE_KEY])
    assert f"keys_file ({tmp_path / 'keys.yaml'})[1].id: duplicate key id 'team-file' " \
        f"(also keys_file ({tmp_path / 'keys.yaml'})[0])" in msg, msg


def test_invalid_entry_is_located_in_the_file(tmp_path: Path) -> None:
    msg = _error(tmp_path, [{**FILE_KEY, "sha256": "nothex", "models": ["nope"]}])
    assert f"keys_file ({tmp_path / 'keys.yaml'})[0].sha256: must be 64 hex" in msg, msg
    assert "keys[2]" not in msg


def test_unknown_model_in_file_is_located_in_the_file(tmp_path: Path) -> None:
    msg = _error(tmp_path, [{**FILE_KEY, "models": ["nope"]}])
    where = f"keys_file ({tmp_path / 'keys.yaml'})[0]"
    assert msg.endswith(f"{where}.models: unknown model 'nope'"), msg


@pytest.mark.parametrize(
    ("content", "problem"),
    [({"id": "x"}, "must hold a YAML list of keys (got a mapping)"),
     ("placeholder-secret", "must hold a YAML list of keys (got a string)"),
     (None, "is empty; it must hold a YAML list of keys")],
)
def test_keys_file_not_a_list(tmp_path: Path, content: Any, problem: str) -> None:
    msg = _error(tmp_path, content)
    assert f"keys_file: {tmp_path / 'keys.yaml'} {problem}" in msg, msg


def test_keys_file_missing_or_not_yaml(tmp_path: Path) -> None:
    msg = _error(tmp_path, [FILE_KEY], keys_file="absent.yaml")
    assert f"keys_file: cannot read {tmp_path / 'absent.yaml'}: No such file or directory" in msg
    (tmp_path / "bad.yaml").write_text("- {id: [\n", encoding="utf-8")
    msg = _error(tmp_path, [FILE_KEY], keys_file="bad.yaml")
    assert f"keys_file: {tmp_path / 'bad.yaml'}:2: not valid YAML" in msg, msg
    assert "Traceback" not in msg


def test_a_key_written_twice_in_one_entry_is_refused_with_its_line(tmp_path: Path) -> None:
    """Like the config file itself: PyYAML kept the last ``models`` silently, so a reviewed
    Secret granting one model could grant another."""
    cfg = {**config(["http://127.0.0.1:9"]), "keys_file": "keys.yaml"}
    path = _write(tmp_path, cfg, [])
    (tmp_path / "keys.yaml").write_text(
        f"- id: team-file\n  sha256: {sha('sg-from-file')}\n  models: [llama-3.1-8b]\n"
        "  models: [other-model]\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load(path, {"VLLM_KEY": "x"})
    keys = tmp_path / "keys.yaml"
    assert info.value.message.endswith(
        f"keys_file ({keys})[0].models: duplicate key 'models' (line 4 of {keys})"), \
        info.value.message


def test_invalid_yaml_in_the_keys_file_is_one_line_with_its_line(tmp_path: Path) -> None:
    cfg = {**config(["http://127.0.0.1:9"]), "keys_file": "keys.yaml"}
    path = _write(tmp_path, cfg, [])
    (tmp_path / "keys.yaml").write_text("- {id: team-file\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load(path, {"VLLM_KEY": "x"})
    msg = info.value.message
    assert len(msg.splitlines()) == 1, msg
    assert msg.endswith(f"keys_file: {tmp_path / 'keys.yaml'}:2: not valid YAML: expected ',' "
                        "or '}', but got '<stream end>'"), msg


@pytest.mark.parametrize("value", [5, "", ["a"]])
def test_keys_file_wrong_type(tmp_path: Path, value: Any) -> None:
    msg = _error(tmp_path, [FILE_KEY], keys_file=value)
    assert "keys_file: must be a file path" in msg, msg


def test_key_from_file_serves_through_the_gateway(
    tmp_path: Path, serve_asgi: Callable[..., Any], sim: Sim, clients: Clients
) -> None:
    cfg = {**config([sim.url]), "keys_file": "keys.yaml"}
    settings = load(_write(tmp_path, cfg, [FILE_KEY]), {"VLLM_KEY": BACKEND_KEY})
    url = start_gateway(serve_asgi, settings)
    r = clients(url, key="sg-from-file").chat.completions.create(
        model="llama-3.1-8b", messages=[{"role": "user", "content": "hi"}]
    )
    assert r.usage is not None and r.usage.completion_tokens > 0
    assert [m.id for m in clients(url, key=KEY_A).models.list()] == ["llama-3.1-8b"]
    with pytest.raises(openai.AuthenticationError):
        clients(url, key="sg-not-in-file").models.list()


def test_policy_explain_sees_keys_from_keys_file(tmp_path: Path) -> None:
    """``policy explain --config`` reads keys like the gateway does, keys_file included."""
    import subprocess
    import sys

    (tmp_path / "policy.yaml").write_text(
        "version: 1\ndata_classes: [internal, confidential]\ndestinations:\n"
        "  - {id: d1, url: 'http://127.0.0.1:9', region: r, jurisdiction: EU, operator: o}\n"
        "rules:\n  - {id: eu, constraints: {jurisdiction: EU}, classes: [internal]}\n",
        encoding="utf-8",
    )
    cfg = {**config(["http://127.0.0.1:9"]), "keys_file": "keys.yaml",
           "policy": {"file": "policy.yaml"}}  # explain speaks for a gateway that enforces it
    path = _write(tmp_path, cfg, [FILE_KEY])
    proc = subprocess.run(
        [sys.executable, "-m", "policy.cli", "explain", str(tmp_path / "policy.yaml"),
         "--config", str(path), "--key", "team-file", "--destination", "d1", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    # team-file's class is confidential (from the file): no rule allows it, so exit 1.
    assert proc.returncode == 1, proc.stderr
    assert '"confidential"' in proc.stdout, proc.stdout


def test_policy_explain_refuses_a_keys_file_the_gateway_refuses(tmp_path: Path) -> None:
    """A field written twice: the gateway refuses the file, ``policy explain`` explained the
    last value (another class than the reviewer saw); invalid YAML was PyYAML's multi-line
    message squeezed into one line."""
    import subprocess
    import sys

    (tmp_path / "policy.yaml").write_text(
        "version: 1\ndata_classes: [internal, confidential]\ndestinations:\n"
        "  - {id: d1, url: 'http://127.0.0.1:9', region: r, jurisdiction: EU, operator: o}\n"
        "rules:\n  - {id: eu, constraints: {jurisdiction: EU}, classes: [internal]}\n",
        encoding="utf-8",
    )
    cfg = {**config(["http://127.0.0.1:9"]), "keys_file": "keys.yaml"}
    path = _write(tmp_path, cfg, [])
    keys = tmp_path / "keys.yaml"

    def explain() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "policy.cli", "explain", str(tmp_path / "policy.yaml"),
             "--config", str(path), "--key", "team-file", "--destination", "d1"],
            capture_output=True, text=True, timeout=60, check=False)

    keys.write_text(f"- {{id: team-file, sha256: {sha('sg-x')}, data_class: confidential,\n"
                    "   data_class: internal}\n", encoding="utf-8")
    proc = explain()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"policy: error [usage_error]: keys_file {keys}:2: "
                                   "[0].data_class: duplicate key"), proc.stderr
    keys.write_text("- {id: team-file\n", encoding="utf-8")
    proc = explain()
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"keys_file {keys}:2: not valid YAML: expected ',' or '}}'" in proc.stderr, proc.stderr
