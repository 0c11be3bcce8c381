"""``bench/calibrate_sim.py``: a profile measured with PyTorch on the CPU drives the simulator.

Runs the calibration with the torch venv's python (``make torch-env``; torch is not a project
dependency) on the tiny shape, loads the written profile with the simulator's own loader, serves
it, and checks the first-token time and the decode time follow the measured figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from vllm_sim.profiles import load_profile

REPO = Path(__file__).resolve().parents[2]
TORCH_PY = Path(os.environ.get("TORCH_PYTHON", REPO / ".tools" / "torch-venv" / "bin" / "python"))

# `make tools` (and so `make test` and CI) builds the torch venv; under CI a missing venv fails.
# slow (31 s: every run of the bench script imports PyTorch): a benchmark tool, like tests/bench;
# the fast lane checks the simulator's profile timings in test_sim_engine.py.
pytestmark = [pytest.mark.skipif(
    not TORCH_PY.exists() and not os.environ.get("CI"),
    reason=f"no torch venv at {TORCH_PY}: run `make torch-env` (part of `make tools`) or set "
    "TORCH_PYTHON",
), pytest.mark.slow]


def _calibrate(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TORCH_PY), str(REPO / "bench" / "calibrate_sim.py"), "--shape", "tiny",
         "--device", "cpu", "--threads", "1", "--out", str(out), *extra],
        capture_output=True, text=True, timeout=300, check=False,
    )


def test_calibrated_profile_loads_and_sets_the_simulators_timings(
    start_sim: Any, tmp_path: Path
) -> None:
    out = tmp_path / "tiny.json"
    proc = _calibrate(out, "--kv-cache-gib", "0.05", "--batches", "1,2,4",
                      "--contexts", "32,256", "--prefill-tokens", "128", "--repeats", "2")
    assert proc.returncode == 0, proc.stderr
    assert "decode batch    4 ctx    256" in proc.stderr
    raw = json.loads(out.read_text())
    profile = load_profile(out)
    assert profile.name == "tiny-measured" and "PyTorch" in profile.description
    # 0.05 GiB / (2 x 2 layers x 2 KV heads x 64 x 4 bytes x 16 tokens) = 1,638 blocks.
    assert profile.num_gpu_blocks == 1638
    assert 10 < profile.prefill_tokens_per_s < 1e8
    assert raw["prefill_tokens_per_s"] == profile.prefill_tokens_per_s
    step1 = profile.step_time_s(0, 1, 200)
    assert step1 > 0

    # Scale model time so the cold prefill of the prompt takes ~1 s of wall time.
    sim_probe = start_sim(profile=str(out))
    prompt = " ".join(f"w{i}" for i in range(300))
    body = {"model": "sim-model", "messages": [{"role": "user", "content": prompt}]}
    ids = httpx.post(f"{sim_probe.url}/tokenize", json=body, timeout=10).json()["tokens"]
    n_prompt = len(ids)
    scale = 1.0 / (n_prompt / profile.prefill_tokens_per_s)
    n_out = max(2, min(200, round(1.0 / (profile.step_time_s(0, 1, n_prompt) * scale))))
    sim = start_sim(profile=str(out), time_scale=scale, tokens_per_response=n_out)

    t0 = time.monotonic()
    times: list[float] = []
    with httpx.stream("POST", f"{sim.url}/v1/chat/completions", timeout=30,
                      json={**body, "stream": True, "max_tokens": n_out}) as resp:
        for line in resp.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                times.append(time.monotonic() - t0)
    assert len(times) == n_out
    want_ttft = n_prompt / profile.prefill_tokens_per_s * scale  # = 1 s by construction
    want_decode = sum(profile.step_time_s(0, 1, n_prompt + k) for k in range(1, n_out)) * scale
    assert 0.95 * want_ttft <= times[0] <= want_ttft + 1.0  # the margin absorbs a loaded machine
    decode = times[-1] - times[0]
    assert 0.9 * want_decode <= decode <= want_decode + 1.0, (decode, want_decode)


def test_bad_arguments_are_named_and_nothing_is_written(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    proc = _calibrate(out, "--shape", "gpt-9")
    assert proc.returncode == 2 and "--shape: unknown 'gpt-9'" in proc.stderr
    proc = _calibrate(out, "--contexts", "64,64")
    assert proc.returncode == 2 and "--contexts: needs two different lengths" in proc.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []
