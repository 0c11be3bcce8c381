"""Configuration: validation errors name the key; secrets come from env or files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from gateway.config.loader import load, parse
from gateway.errors import ConfigError
from tests.gateway.helpers import config, sha

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.yaml"


def bad(cfg: dict[str, Any], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse(cfg, env if env is not None else {"VLLM_KEY": "k"})
    return info.value.message


def test_example_config_is_valid() -> None:
    s = load(EXAMPLE, {"VLLM_KEY": "secret"})
    assert s.listen.port == 8080
    model = s.models[0]
    assert model.upstream_name == "meta-llama/Llama-3.1-8B-Instruct"
    assert model.replicas[0].api_key is not None
    assert model.replicas[0].api_key.get_secret_value() == "secret"
    assert model.replicas[0].destination == "vllm-eu-1"
    assert s.keys[0].data_class == "internal"
    assert s.timeouts.first_byte_s == 60


def test_settings_are_frozen() -> None:
    s = parse(config(["http://127.0.0.1:1"]), {"VLLM_KEY": "k"})
    with pytest.raises(pydantic.ValidationError):
        s.limits.max_body_bytes = 1  # type: ignore[misc]


def test_defaults_and_optional_sections_accepted(tmp_path: Path) -> None:
    cfg = config(["http://127.0.0.1:1"])
    cfg.update(policy={"file": "policy.yaml"}, audit={"store": "sqlite:///x.db"}, quotas={},
               telemetry={})
    s = parse(cfg, {"VLLM_KEY": "k"}, tmp_path)
    assert s.policy is not None and s.policy.file == tmp_path / "policy.yaml"
    assert s.audit is not None and s.audit.store == "sqlite:///x.db"
    assert s.limits.max_body_bytes == 16 * 1024 * 1024


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["models"][0]["replicas"][1].update(url="ftp://x"),
         "models[0].replicas[1].url: must be an http:// or https:// URL"),
        (lambda c: c["models"][0]["replicas"][0].update(url="http://u:p@h:1"),
         "models[0].replicas[0].url: must not contain credentials"),
        (lambda c: c["models"][0].update(replicas=[]),
         "models[0].replicas: List should have at least 1 item"),
        (lambda c: c["models"][1].update(aliases=["default"]),
         "name or alias 'default' already used by 'llama-3.1-8b'"),
        (lambda c: c["keys"][0].update(sha256="abc"), "keys[0].sha256: must be 64 hex"),
        (lambda c: c["keys"][1].update(models=["nope"]), "keys[1].models: unknown model 'nope'"),
        (lambda c: c["keys"][0].update(models=["default"]),
         "keys[0].models: 'default' is an alias of 'llama-3.1-8b'"),
        (lambda c: c["keys"][1].update(id="team-a", sha256=sha("x")),
         "keys[1].id: duplicate key id 'team-a'"),
        (lambda c: c["timeouts"].update(connect_s=0),
         "timeouts.connect_s: Input should be greater"),
        (lambda c: c.update(limits={"max_body_bytes": "big"}), "limits.max_body_bytes"),
        (lambda c: c.update(listen={"port": 70000}), "listen.port"),
        (lambda c: c.update(polcy={}), "polcy: unknown key (did you mean 'policy'?)"),
        (lambda c: c["models"][0].update(served_model_nmae="x"),
         "models[0].served_model_nmae: unknown key (did you mean 'served_model_name'?)"),
        (lambda c: c["models"][0]["replicas"][0].update(destinaton="x"),
         "models[0].replicas[0].destinaton: unknown key (did you mean 'destination'?)"),
        (lambda c: c["keys"][0].update(zzz=1),
         "keys[0].zzz: unknown key (known here: id, sha256, models, team, data_class)"),
        (lambda c: c.update(quotas={"keys": {"bot": {"requests_per_minut": 5}}}),
         "quotas.keys.bot.requests_per_minut: unknown key (did you mean "
         "'requests_per_minute'?)"),
        (lambda c: c.update(flow_control={"classes": [{"name": "a", "max_wai_s": 2}]}),
         "flow_control.classes[0].max_wai_s: unknown key (did you mean 'max_wait_s'?)"),
        # Without managed keys, an override naming no key or team is a typo (it was accepted:
        # the key it meant ran without its limit or class).
        (lambda c: c.update(quotas={"keys": {"team-aa": {"requests_per_minute": 5}}}),
         "quotas.keys.team-aa: no key has the key id 'team-aa' (known: team-a, team-b)"),
        (lambda c: c.update(quotas={"teams": {"b": {"tokens_per_day": 5}}}),
         "quotas.teams.b: no key has the team 'b' (known: a)"),
        (lambda c: c.update(flow_control={"classes": [{"name": "x"}], "default_class": "x",
                                          "keys": {"nobody": {"class": "x"}}}),
         "flow_control.keys.nobody: no key has the key id 'nobody'"),
        (lambda c: c.update(limits={"forward_headers": ["Authorization"]}),
         "limits.forward_headers: 'Authorization' carries client credentials"),
    ],
)
def test_invalid_config_names_key_and_problem(mutate: Any, expected: str) -> None:
    cfg = config(["http://127.0.0.1:1", "http://127.0.0.1:2"])
    mutate(cfg)
    assert expected in bad(cfg)


def test_missing_env_secret_names_variable() -> None:
    msg = bad(config(["http://127.0.0.1:1"]), env={})
    assert "models[0].replicas[0].api_key_env: environment variable VLLM_KEY is not set" in msg


def test_inline_secret_refused() -> None:
    cfg = config(["http://127.0.0.1:1"])
    cfg["models"][0]["replicas"][0]["api_key"] = "plaintext"
    assert "models[0].replicas[0].api_key: secrets do not belong in the file" in bad(cfg)


def test_secret_from_file_relative_to_config(tmp_path: Path) -> None:
    (tmp_path / "vllm.key").write_text("file-secret\n")
    cfg = config(["http://127.0.0.1:1"])
    del cfg["models"][0]["replicas"][0]["api_key_env"]
    cfg["models"][0]["replicas"][0]["api_key_file"] = "vllm.key"
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    s = load(path, {})
    key = s.models[0].replicas[0].api_key
    assert key is not None and key.get_secret_value() == "file-secret"
    assert "file-secret" not in repr(s)
    (tmp_path / "vllm.key").unlink()
    with pytest.raises(ConfigError, match=r"api_key_file: cannot read .*vllm.key"):
        load(path, {})


def test_unreadable_and_non_yaml_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load(tmp_path / "missing.yaml")
    path = tmp_path / "x.yaml"
    path.write_text("models: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(path)
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load(path)


def test_environment_never_overrides_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stray environment variable must not change a reviewed config."""
    monkeypatch.setenv("LIMITS", '{"max_body_bytes": 1}')
    monkeypatch.setenv("MAX_BODY_BYTES", "1")
    s = parse(config(["http://127.0.0.1:1"]), {"VLLM_KEY": "k"})
    assert s.limits.max_body_bytes == 16 * 1024 * 1024


def test_overrides_may_name_managed_keys_when_there_is_a_keystore(tmp_path: Path) -> None:
    cfg = config(["http://127.0.0.1:1"])
    cfg["quotas"] = {"keys": {"created-later": {"requests_per_minute": 5}},
                     "teams": {"search": {"tokens_per_day": 100}}}
    cfg["keystore"] = {"store": f"sqlite:///{tmp_path}/keys.db"}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert "created-later" in load(path, {"VLLM_KEY": "x"}).quotas.keys  # type: ignore[union-attr]
