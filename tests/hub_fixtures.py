"""Pytest plugin: a faithful Hugging Face Hub emulator on loopback.

Register with ``pytest_plugins = ["tests.hub_fixtures"]`` in ``tests/conftest.py`` (or import
the fixtures into a package conftest). Fixtures:

* ``hub`` (function): a fresh :class:`tests.hub_emulator.Hub` with three repositories:

  - ``sentence-transformers/all-MiniLM-L6-v2``: the real snapshot (``minilm_snapshot``) on
    ``main``, tagged ``v1.0``; licence apache-2.0 from its README front matter.
  - ``sg-test/tiny-sharded``: a generated two-shard safetensors checkpoint with
    ``model.safetensors.index.json``, ``config.json``, an empty file, a file in a subfolder and
    a file with a non-ASCII name; licence mit.
  - ``sg-test/gated-tiny``: gated (``manual``), licence llama3; downloads need
    ``HUB_TOKEN``.

* ``hub_server`` (function): the hub served by ``serve_asgi``; ``.url`` is the endpoint to
  pass as ``HF_ENDPOINT`` (subprocesses) or ``endpoint=`` (in process), ``.hub`` the state.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.hub_emulator import Blob, Hub, create_hub_app, make_sharded

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SHARDED = "sg-test/tiny-sharded"
GATED = "sg-test/gated-tiny"
HUB_TOKEN = "hf_emulator_token"  # noqa: S105 - test token of the emulator
NON_ASCII_PATH = "notes/modèle-ü.md"


@dataclass
class HubServer:
    """A running emulator: ``url`` (endpoint), ``hub`` (mutable state), ``server``."""

    url: str
    hub: Hub
    server: Any


def _card(license_id: str, extra: str = "") -> bytes:
    head = f"---\nlicense: {license_id}\nlibrary_name: transformers\n---\n"
    return f"{head}# Test model\n{extra}".encode()


def tiny_config(layers: int = 2) -> dict[str, Any]:
    """A llama-style config matching the generated shards."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": layers, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "torch_dtype": "bfloat16",
        "max_position_embeddings": 2048, "tie_word_embeddings": False,
    }


def sharded_files() -> dict[str, bytes]:
    """Files of the ``sg-test/tiny-sharded`` repository (deterministic)."""
    shard1 = {"model.embed_tokens.weight": ("BF16", (256, 64)),
              "model.layers.0.self_attn.q_proj.weight": ("BF16", (64, 64))}
    shard2 = {"model.layers.1.self_attn.q_proj.weight": ("BF16", (64, 64)),
              "lm_head.weight": ("BF16", (256, 64)), "model.norm.weight": ("F32", (64,))}
    files = make_sharded([shard1, shard2])
    files["config.json"] = (json.dumps(tiny_config(), indent=2) + "\n").encode()
    files["README.md"] = _card("mit")
    files["empty.txt"] = b""
    files["tokenizer/special_tokens_map.json"] = b'{"bos_token": "<s>", "eos_token": "</s>"}\n'
    files[NON_ASCII_PATH] = "Notes sur le modèle: ü, 日本語.\n".encode()
    return files


@pytest.fixture(scope="session")
def minilm_blobs(minilm_snapshot: Path) -> dict[str, Blob]:
    """The real MiniLM snapshot as emulator blobs (read once per session)."""
    return {
        p.relative_to(minilm_snapshot).as_posix(): Blob(p.read_bytes())
        for p in sorted(minilm_snapshot.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def hub(minilm_blobs: dict[str, Blob]) -> Hub:
    """A fresh emulated hub (see module docstring)."""
    h = Hub(tokens=(HUB_TOKEN,))
    minilm = h.add_repo(MINILM)
    minilm.commit(dict(minilm_blobs), message="Initial commit")
    minilm.tag("v1.0", "main")
    sharded = h.add_repo(SHARDED)
    sharded.commit({k: Blob(v) for k, v in sharded_files().items()}, message="Add checkpoint")
    gated = h.add_repo(GATED, gated="manual")
    gated.commit({
        "README.md": _card("llama3"),
        "config.json": (json.dumps(tiny_config(1)) + "\n").encode(),
        "model.safetensors": sharded_files()["model-00002-of-00002.safetensors"],
    })
    return h


@pytest.fixture
def hub_server(hub: Hub, serve_asgi: Callable[..., Any]) -> HubServer:
    """The emulated hub served on 127.0.0.1 by a real uvicorn."""
    server = serve_asgi(create_hub_app(hub))
    return HubServer(url=server.url, hub=hub, server=server)
