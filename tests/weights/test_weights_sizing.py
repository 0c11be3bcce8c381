"""weights size: memory arithmetic checked against published figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hub_emulator import make_safetensors
from tests.hub_fixtures import SHARDED, HubServer
from tests.weights.cli_util import run_cli
from weights.errors import SizingError
from weights.memory import size_model
from weights.sizing import GB, count_params, local_safetensors, read_header_file

CONFIGS = Path(__file__).parent / "configs"
KIB = 1024


def _cfg(name: str) -> dict[str, object]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def test_llama3_70b_kv_cache_is_320_kib_per_token() -> None:
    r = size_model(_cfg("llama-3-70b"), context=8192, concurrency=4)
    per_token = r.figure("kv cache per token")
    assert per_token.value == 320 * KIB
    assert "num_hidden_layers" in per_token.source and "num_key_value_heads" in per_token.source
    assert "hidden_size" in r.figure("head dim").source  # derived: 8192 / 64 = 128
    assert r.figure("kv cache").value == 320 * KIB * 8192 * 4  # 10 GiB
    # ~70.6 B parameters (published), estimated from config.
    assert 70.4e9 < r.figure("parameters").value < 70.8e9


def test_405b_weights_bf16_fp8_and_room_left_on_eight_80gb_gpus() -> None:
    cfg = _cfg("llama-3.1-405b")
    bf16 = size_model(cfg)
    assert 805 * GB < bf16.figure("weights").value < 815 * GB  # "about 810 GB"
    fp8 = size_model(cfg, dtype="fp8", gpu_mem_bytes=80 * GB, gpus=8)
    assert 402 * GB < fp8.figure("weights").value < 408 * GB  # "about 405 GB"
    left = fp8.figure("free after weights").value
    assert 230 * GB < left < 240 * GB  # "leaves about 235 GB"
    assert fp8.fits is True and fp8.min_gpus == 8
    assert "--dtype" in fp8.figure("weights").source
    # BF16 does not fit on eight 80 GB GPUs.
    assert size_model(cfg, gpu_mem_bytes=80 * GB, gpus=8).fits is False


def test_moe_counts_total_not_active_parameters() -> None:
    r = size_model(_cfg("mixtral-8x7b"))
    # Mixtral 8x7B: 46.7 B total (12.9 B active).
    assert 46.4e9 < r.figure("parameters").value < 47.0e9
    assert "num_local_experts" in r.figure("parameters").source


def test_mla_kv_cache_uses_the_compressed_latent() -> None:
    r = size_model(_cfg("deepseek-v3"))
    per_token = r.figure("kv cache per token")
    assert per_token.value == (512 + 64) * 61 * 2  # 70,272 bytes, not 2 x 61 x 128 x 128 x 2
    assert "kv_lora_rank" in per_token.source and "qk_rope_head_dim" in per_token.source
    # DeepSeek-V3: 671 B total parameters (MoE counted in full; estimate within 2 %).
    assert 660e9 < r.figure("parameters").value < 690e9


def test_exact_counts_from_safetensors_headers(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(_cfg("llama-3-70b")))
    (tmp_path / "a.safetensors").write_bytes(make_safetensors(
        {"w": ("BF16", (1000, 3)), "n": ("F32", (7,)), "q": ("F8_E4M3", (5, 5))}))
    files = local_safetensors(tmp_path)
    pc = count_params((f.name, read_header_file(f)) for f in files)
    assert dict(pc.by_dtype) == {"BF16": 3000, "F32": 7, "F8_E4M3": 25}
    assert pc.stored_bytes == 3000 * 2 + 7 * 4 + 25
    r = size_model(_cfg("llama-3-70b"), pc)
    assert r.figure("parameters").value == 3032 and r.figure("weights").value == 6053
    assert r.figure("parameters BF16").source == "a.safetensors"


def test_malformed_headers_are_rejected(tmp_path: Path) -> None:
    p = tmp_path / "bad.safetensors"
    p.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(SizingError, match="exceeds"):
        read_header_file(p)
    p.write_bytes((50).to_bytes(8, "little") + b"{")
    with pytest.raises(SizingError, match="runs past the end"):
        read_header_file(p)
    with pytest.raises(SizingError, match="num_hidden_layers"):
        size_model({"hidden_size": 8})


def test_cli_size_local_json_and_fit_exit_code(tmp_path: Path) -> None:
    cfg = CONFIGS / "llama-3.1-405b.json"
    r = run_cli(["size", str(cfg), "--dtype", "fp8", "--gpu-mem", "80GB", "--gpus", "8",
                 "--context", "8192", "--concurrency", "8", "--json"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["fits"] is True and doc["min_gpus"] == 8
    assert all(f["source"] for f in doc["figures"])
    r = run_cli(["size", str(cfg), "--gpu-mem", "80GB", "--gpus", "8"])
    assert r.returncode == 1 and "does NOT fit" in r.stdout


def test_cli_size_repo_id_reads_headers_with_range_requests(hub_server: HubServer) -> None:
    r = run_cli(["size", SHARDED, "--json"], endpoint=hub_server.url)
    assert r.returncode == 0, r.stderr
    doc = {f["name"]: f for f in json.loads(r.stdout)["figures"]}
    assert doc["parameters"]["value"] == 256 * 64 * 2 + 64 * 64 * 2 + 64
    assert doc["parameters BF16"]["value"] == 256 * 64 * 2 + 64 * 64 * 2
    shard_gets = [q for q in hub_server.hub.requests if q.path.endswith(".safetensors")]
    assert shard_gets and all(q.method == "GET" and q.range for q in shard_gets)
