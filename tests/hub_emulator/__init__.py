"""A faithful local Hugging Face Hub for tests (served on loopback by ``serve_asgi``).

Use through the fixtures in ``tests/hub_fixtures.py`` or directly::

    hub = Hub(); repo = hub.add_repo("org/name"); sha = repo.commit({"config.json": b"{}"})
    server = serve_asgi(create_hub_app(hub)); HfApi(endpoint=server.url).model_info("org/name")
"""

from tests.hub_emulator.app import create_hub_app
from tests.hub_emulator.model import (
    LFS_SUFFIXES,
    LFS_THRESHOLD_BYTES,
    Blob,
    Commit,
    FileEntry,
    Hub,
    Repo,
    RequestRecord,
    git_blob_sha1,
    is_lfs_path,
)
from tests.hub_emulator.safetensors_gen import DTYPE_BYTES, make_safetensors, make_sharded

__all__ = [
    "DTYPE_BYTES",
    "LFS_SUFFIXES",
    "LFS_THRESHOLD_BYTES",
    "Blob",
    "Commit",
    "FileEntry",
    "Hub",
    "Repo",
    "RequestRecord",
    "create_hub_app",
    "git_blob_sha1",
    "is_lfs_path",
    "make_safetensors",
    "make_sharded",
]
