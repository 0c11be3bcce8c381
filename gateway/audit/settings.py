"""The ``audit:`` section of the gateway configuration (embedded by ``gateway.config.settings``)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from clishell import read_input_text
from gateway.audit.errors import AuditConfigError
from gateway.audit.store import sqlite_url_under

_SCHEMES = ("sqlite://", "postgresql://", "postgres://")
_REPLICA_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def _default_replica() -> str:
    name = socket.gethostname().split(".")[0] or "gateway"
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", name)[:63]
    return cleaned if _REPLICA_RE.match(cleaned) else "gateway"


class AuditSettings(BaseModel):
    """Audit log configuration.

    Attributes:
        enabled: Record every request; when the store is down requests get 503.
        store: ``sqlite:///abs/path.db`` or ``postgresql://user@host:port/db``.
        store_file: A file holding the store URL (keeps a database password out of the
            config); overrides ``store``.
        signing_key_file: Ed25519 signed-note private key (``gateway audit keygen``).
        pseudonym_key_file: HMAC key for client addresses and content digests.
        replica_id: Names this replica's chains; default: the host name.
        checkpoint_every_records: Sign a checkpoint after this many records.
        checkpoint_every_s: ... or after this many seconds with unsealed records.
        heartbeat_s: When idle, write a heartbeat record + checkpoint this often (seconds).
        checkpoint_dir: Also write each chain's newest checkpoint here (outside the database).
        max_batch_records: Upper bound of records committed in one transaction.
        store_timeout_s: How long an append may wait for a locked SQLite file or a PostgreSQL
            connection before it fails (and the request gets 503), seconds.
        refusal_ipv6_prefix: Counted refusals (``http.refused``, ``request.refused``...) key
            an IPv6 client by its network of this prefix length (IPv4: by its address).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    store: str = "sqlite:///var/lib/sovereign-gateway/audit.db"
    store_file: Path | None = None
    signing_key_file: Path = Path("/var/lib/sovereign-gateway/audit-signing.key")
    pseudonym_key_file: Path = Path("/var/lib/sovereign-gateway/audit-pseudonym.key")
    replica_id: str = Field(default_factory=_default_replica)
    checkpoint_every_records: int = Field(default=1000, ge=1)
    checkpoint_every_s: float = Field(default=10.0, gt=0)
    heartbeat_s: float = Field(default=60.0, gt=0)
    checkpoint_dir: Path | None = None
    max_batch_records: int = Field(default=512, ge=1)
    store_timeout_s: float = Field(default=5.0, gt=0)
    refusal_ipv6_prefix: int = Field(default=64, ge=1, le=128)

    @field_validator("replica_id")
    @classmethod
    def _check_replica(cls, value: str) -> str:
        if not _REPLICA_RE.match(value):
            raise ValueError("replica_id must match [A-Za-z0-9][A-Za-z0-9._-]{0,62}")
        return value

    @field_validator("store")
    @classmethod
    def _check_store(cls, value: str) -> str:
        if not value.startswith(_SCHEMES):
            raise ValueError("store must be sqlite:///PATH or postgresql://...")
        return value

    def under(self, base: Path) -> AuditSettings:
        """These settings with every relative path made relative to ``base``.

        ``base`` is the config file's directory: the key files, ``checkpoint_dir``,
        ``store_file`` and a relative SQLite ``store`` (``sqlite://audit.db``) mean files next
        to the config, whatever the working directory of the command that reads it
        (``gateway serve``, ``gateway audit ... --config``).
        """
        updates: dict[str, object] = {}
        for name in ("signing_key_file", "pseudonym_key_file", "checkpoint_dir", "store_file"):
            value = getattr(self, name)
            if isinstance(value, Path) and not value.is_absolute():
                updates[name] = base / value
        store = sqlite_url_under(self.store, base)
        if store != self.store:
            updates["store"] = store
        return self.model_copy(update=updates) if updates else self

    def store_url(self) -> str:
        """The store URL: the content of ``store_file`` if set, else ``store``.

        Raises:
            AuditConfigError: If ``store_file`` cannot be read or holds no valid URL.
        """
        if self.store_file is None:
            return self.store
        try:
            url = read_input_text(self.store_file).strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise AuditConfigError(
                f"cannot read audit store_file {self.store_file}: {exc}"
            ) from exc
        if not url.startswith(_SCHEMES):
            raise AuditConfigError(f"{self.store_file}: not a sqlite:// or postgresql:// URL")
        return url
