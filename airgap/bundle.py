"""The bundle format (version 1): the index model and its deterministic serialisation.

A bundle is a plain directory (spec: docs/bundle-format.md)::

    index.json            what the bundle holds (this module)
    index.sig             detached Ed25519 signature over the exact bytes of index.json
    payload.000-of-003    the payload byte stream, split into parts of at most part_size bytes
    payload.001-of-003
    payload.002-of-003

The payload is the concatenation of every distinct content blob (keyed by SHA-256, stored once),
in index order, as is or (``--compress``) zlib-encoded when that helps. Parts are located only
through the index, never by globbing. Parsing is strict (``airgap.validate``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from weights import Lockfile

FORMAT = "sovereign-gateway/airgap-bundle"
FORMAT_VERSION = 1
INDEX_NAME = "index.json"
SIGNATURE_NAME = "index.sig"
#: 4 GiB minus one byte: the largest file FAT32 can hold.
DEFAULT_PART_SIZE = 4 * 1024**3 - 1
#: Upper bound when reading index.json from untrusted media, in bytes.
MAX_INDEX_BYTES = 64 * 1024**2
#: A bundle has at most this many parts (``pack`` refuses more, the validator too): each is a
#: file to copy, list and check; a smaller ``--part-size`` is almost certainly a unit mistake.
MAX_PARTS = 10_000


@dataclass(frozen=True)
class Part:
    """One payload part: bytes ``[offset, offset + size)`` of the payload stream."""

    name: str
    offset: int
    size: int
    sha256: str


ENCODINGS = ("identity", "zlib")
COMPRESSIONS = ("none", "zlib")


@dataclass(frozen=True)
class Blob:
    """One stored content blob: payload bytes ``[offset, offset + stored_size)``.

    Attributes:
        sha256: hex SHA-256 of the content (after decoding).
        size: content size in bytes.
        offset: where the stored bytes start in the payload stream.
        stored_size: stored bytes in the payload (``size`` unless encoded).
        encoding: ``identity`` or ``zlib`` (RFC 1950 stream of the content).
    """

    sha256: str
    size: int
    offset: int
    stored_size: int
    encoding: str = "identity"


@dataclass(frozen=True)
class ContentFile:
    """One file the bundle carries.

    Attributes:
        repo_id: the model repository, or None for an extra file (policy, chart, ...).
        path: path inside the model snapshot (or under the extras directory).
        size: size in bytes.
        sha256: hex SHA-256 of the content; names the blob in the payload.
        blob_id: Hugging Face cache blob name (sha256 for LFS files, git blob SHA-1 otherwise;
            the sha256 for extras).
    """

    repo_id: str | None
    path: str
    size: int
    sha256: str
    blob_id: str

    @property
    def label(self) -> str:
        """``repo_id:path`` for model files, ``extra:path`` for extras (used in reports)."""
        return f"{self.repo_id or 'extra'}:{self.path}"


@dataclass(frozen=True)
class BaseBlob:
    """Content a delta bundle does not carry: the far side's store must already hold it.

    Attributes:
        sha256: hex SHA-256 of the content.
        size: content size in bytes.
    """

    sha256: str
    size: int


@dataclass(frozen=True)
class Base:
    """What a delta bundle (``airgap pack --since``) expects on the far side (``airgap.delta``).

    Attributes:
        index_sha256: hex SHA-256 of the base bundle's ``index.json`` (informational).
        blobs: contents used by ``files`` but left out of the payload, by sha256.
    """

    index_sha256: str
    blobs: tuple[BaseBlob, ...]


@dataclass(frozen=True)
class Segment:
    """A byte range of one part: ``length`` bytes from ``start`` within ``part``."""

    part: Part
    start: int
    length: int


@dataclass(frozen=True)
class Index:
    """Parsed, structurally valid ``index.json``.

    Attributes:
        tool: name and version of the packer.
        created_at: UTC creation time, ``YYYY-MM-DDTHH:MM:SSZ``.
        compression: ``none`` (every blob stored as is) or ``zlib`` (blobs that shrink are
            zlib-encoded).
        part_size: maximum part size in bytes used when packing.
        payload_size: total payload bytes (sum of part sizes and of blob sizes).
        lock: the lockfile entries carried (the pins the content must match).
        files: every content file, models first (by repo id, path), then extras.
        blobs: stored blobs in payload order.
        parts: parts in payload order.
        base: None for a full bundle; for a delta, the contents it expects in the store.
    """

    tool: str
    created_at: str
    compression: str
    part_size: int
    payload_size: int
    lock: Lockfile
    files: tuple[ContentFile, ...]
    blobs: tuple[Blob, ...]
    parts: tuple[Part, ...]
    base: Base | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the index as a JSON-ready dict (the documented schema; ``base`` only for a
        delta bundle)."""
        doc = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "tool": self.tool,
            "created_at": self.created_at,
            "compression": self.compression,
            "part_size": self.part_size,
            "payload_size": self.payload_size,
            "lock": self.lock.to_json(),
            "files": [
                {
                    "repo_id": f.repo_id,
                    "path": f.path,
                    "size": f.size,
                    "sha256": f.sha256,
                    "blob_id": f.blob_id,
                }
                for f in self.files
            ],
            "blobs": [
                {
                    "sha256": b.sha256,
                    "size": b.size,
                    "offset": b.offset,
                    "stored_size": b.stored_size,
                    "encoding": b.encoding,
                }
                for b in self.blobs
            ],
            "parts": [
                {"name": p.name, "offset": p.offset, "size": p.size, "sha256": p.sha256}
                for p in self.parts
            ],
        }
        if self.base is not None:
            doc["base"] = {
                "index_sha256": self.base.index_sha256,
                "blobs": [{"sha256": b.sha256, "size": b.size} for b in self.base.blobs],
            }
        return doc

    def dumps(self) -> bytes:
        """Serialise deterministically (sorted keys, 2-space indent, UTF-8, final newline)."""
        text = json.dumps(self.to_json(), indent=2, sort_keys=True, ensure_ascii=False)
        return (text + "\n").encode("utf-8")

    def model_files(self, repo_id: str) -> list[ContentFile]:
        """Files of one model, in path order."""
        return [f for f in self.files if f.repo_id == repo_id]

    @property
    def extras(self) -> list[ContentFile]:
        """Extra (non-model) files."""
        return [f for f in self.files if f.repo_id is None]

    def files_of_blob(self, sha256: str) -> list[ContentFile]:
        """Files whose content is blob ``sha256``."""
        return [f for f in self.files if f.sha256 == sha256]

    def segments(self, offset: int, size: int) -> Iterator[Segment]:
        """Yield the part ranges that hold payload bytes ``[offset, offset + size)``."""
        end = offset + size
        for part in self.parts:
            lo = max(offset, part.offset)
            hi = min(end, part.offset + part.size)
            if lo < hi:
                yield Segment(part, lo - part.offset, hi - lo)
