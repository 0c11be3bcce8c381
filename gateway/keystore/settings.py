"""The ``keystore:`` configuration section (managed keys)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class KeystoreSettings(BaseModel):
    """Managed keys configuration.

    Attributes:
        enabled: accept managed keys (besides the ``keys:`` of the config file).
        store: ``sqlite:///abs/path.db`` or ``postgresql://...``; None = the audit store.
        refresh_s: how often each replica polls the store for changes, in seconds: a
            revocation takes effect on every replica within this (plus one query).
        max_stale_s: if the store could not be read for this long, managed keys are refused
            with 503 (a revocation might have been missed); config keys keep working.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    store: str | None = None
    refresh_s: float = Field(default=2.0, gt=0, le=60)
    max_stale_s: float = Field(default=30.0, gt=0)

    @field_validator("store")
    @classmethod
    def _check_store(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(
            ("sqlite:///", "postgresql://", "postgres://")
        ):
            raise ValueError("store must be sqlite:///PATH or postgresql://...")
        return value
