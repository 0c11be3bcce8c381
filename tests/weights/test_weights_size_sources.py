"""weights size says where each dtype came from, keeps weights and KV dtypes consistent, and
prints whole quantities as JSON integers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.hub_emulator import make_safetensors
from tests.weights.cli_util import run_cli
from weights.memory import size_model

TINY: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 256, "intermediate_size": 128,
}


def _size(tmp_path: Path, config: dict[str, Any], *args: str,
          tensors: dict[str, tuple[str, tuple[int, ...]]] | None = None) -> dict[str, Any]:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        (model / "model.safetensors").write_bytes(make_safetensors(tensors))
    res = run_cli(["size", str(model), "--json", "--context", "1000", "--gpu-mem", "1GiB",
                   "--gpus-per-node", "1", "--concurrency", "1", "--overhead", "1MiB",
                   *args])
    assert res.returncode == 0, res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def _figures(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in doc["figures"]}


def test_no_dtype_anywhere_is_said_not_cited_from_config(tmp_path: Path) -> None:
    doc = _size(tmp_path, TINY)
    figs = _figures(doc)
    assert "torch_dtype=" not in json.dumps(doc)  # the config has none
    assert doc["dtypes"]["weights"]["name"] == "bf16"
    assert doc["dtypes"]["weights"]["source"].startswith("assumed bf16: neither config.json")
    assert "assumed bf16" in figs["weights"]["source"]
    assert "assumed bf16" in figs["kv cache per token"]["source"]


def test_dtype_from_the_safetensors_headers_when_the_config_has_none(tmp_path: Path) -> None:
    doc = _size(tmp_path, TINY, tensors={"w": ("F16", (256, 64)), "n": ("F32", (64,))})
    kv = doc["dtypes"]["kv_cache"]
    assert kv["name"] == "fp16"
    assert kv["source"].startswith("safetensors headers: F16 holds 100% of parameters")
    # 2 x layers x kv heads x head dim x 2 bytes (fp16)
    assert _figures(doc)["kv cache per token"]["value"] == 2 * 2 * 2 * 16 * 2


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_config_dtype_field_is_named(tmp_path: Path, key: str) -> None:
    doc = _size(tmp_path, TINY | {key: "float32"})
    assert doc["dtypes"]["weights"] == {"name": "float32",
                                        "source": f"config.json:{key}=float32"}
    assert _figures(doc)["kv cache per token"]["value"] == 2 * 2 * 2 * 16 * 4


def test_kv_follows_an_activation_dtype_flag_not_a_quantised_one() -> None:
    cfg = TINY | {"torch_dtype": "float32"}
    fp16 = size_model(cfg, dtype="fp16", context=10)
    assert fp16.kv_dtype is not None and fp16.kv_dtype.name == "fp16"
    assert fp16.kv_dtype.source.startswith("--dtype")
    assert fp16.figure("kv cache per token").value == 2 * 2 * 2 * 16 * 2
    fp8 = size_model(cfg, dtype="fp8", context=10)
    assert fp8.kv_dtype is not None and fp8.kv_dtype.name == "float32"  # activations
    explicit = size_model(cfg, dtype="fp16", kv_dtype="fp8", context=10)
    assert explicit.kv_dtype is not None and explicit.kv_dtype.source == "--kv-dtype"
    assert explicit.figure("kv cache per token").value == 2 * 2 * 2 * 16


def test_json_counts_are_integers(tmp_path: Path) -> None:
    doc = _size(tmp_path, TINY, "--utilization", "0.9", "--dtype", "int4")
    for f in doc["figures"]:
        if f["unit"] in ("bytes", "tokens", "params") or f["unit"] == "":
            assert isinstance(f["value"], int), f
    figs = _figures(doc)
    assert figs["usable per gpu"]["value"] == -(-1024**3 * 9 // 10)  # bytes rounded up
    assert ".0," not in json.dumps(doc)
