"""Opt-in: a real vLLM (CPU) serves a model that `airgap unpack` installed, fully offline.

Runs only when ``SG_VLLM_PYTHON`` points to a Python with vLLM installed (e.g.
``.tools/vllm-venv/bin/python``): ``SG_VLLM_PYTHON=.tools/vllm-venv/bin/python
.venv/bin/python -m pytest -m vllm tests/airgap``. The real all-MiniLM-L6-v2 snapshot is packed,
verified and unpacked into an empty Hugging Face cache, then vLLM is started with
``HF_HUB_OFFLINE=1`` and that cache, by repo id and pinned commit, and asked for embeddings
through the official ``openai`` client.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from airgap_helpers import KeyPair, lock_entry_from_dir, write_lock

from airgap import pack_bundle, unpack_bundle, verify_bundle
from tests.conftest import free_port
from tests.hub_fixtures import MINILM

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not os.environ.get("SG_VLLM_PYTHON"), reason="SG_VLLM_PYTHON not set"),
    pytest.mark.timeout(900),
]


def test_vllm_serves_unpacked_store_offline(
    minilm_snapshot: Path, keys: KeyPair, tmp_path: Path
) -> None:
    from openai import OpenAI

    lock = write_lock(tmp_path / "weights.lock", lock_entry_from_dir(minilm_snapshot, MINILM))
    commit = lock.entry(MINILM).commit
    bundle, store = tmp_path / "bundle", tmp_path / "hf-cache"
    pack_bundle(lock, minilm_snapshot, bundle, keys.private, part_size=32 * 1024**2)
    assert verify_bundle(bundle, [keys.public]).ok
    unpack_bundle(bundle, [keys.public], store)

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(store), HF_HUB_DISABLE_TELEMETRY="1",
               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               VLLM_CPU_KVCACHE_SPACE="1")  # fmt: skip
    log = tmp_path / "vllm.log"
    cmd = [os.environ["SG_VLLM_PYTHON"], "-m", "vllm.entrypoints.openai.api_server",
           "--model", MINILM, "--revision", commit, "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", "256", "--dtype", "float32"]  # fmt: skip
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM did not start:\n{log.read_text()[-4000:]}")
            time.sleep(2)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
        assert [m.id for m in client.models.list().data] == [MINILM]
        emb = client.embeddings.create(model=MINILM, input=["air-gapped hello"])
        assert len(emb.data[0].embedding) == 384
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
