"""The ``preflight:`` section of the gateway config: the continuous pre-flight.

```yaml
preflight:
  interval_s: 300                     # seconds between rounds
  regions: [eu-central-1]             # allowed regions (policy destinations, OTLP collector)
  jurisdictions: [EU]
  retention_days: 400                 # declared audit retention (AI Act Art. 26(6))
  audit_public_key: audit-key.pub     # verifies the audit chain and checkpoints
  evidence_dir: /var/lib/sg/evidence  # signed pack per day and on change (needs sign_key_file)
  sign_key_file: operator-ed25519.pem
```

It needs the admin port (``telemetry:``): results go to ``/metrics`` and ``/status``. Paths
are relative to the config file. Used by :mod:`gateway.preflight.continuous`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["ContinuousSettings"]


class ContinuousSettings(BaseModel):
    """The continuous pre-flight (see the module docstring for the keys).

    Attributes:
        enabled: Off: no rounds (the section may stay in the file).
        interval_s: Seconds between the end of one round and the start of the next.
        regions: Allowed regions.
        jurisdictions: Allowed jurisdictions.
        retention_days: Declared audit log retention, days (``None``: not checked).
        audit_public_key: Audit verifier key (``None``: chain and signatures not verified).
        evidence_dir: Where signed evidence packs go (``None``: none written).
        sign_key_file: Operator's Ed25519 private key (PEM) signing the packs.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    interval_s: float = Field(default=300.0, gt=0)
    regions: list[str] = Field(default_factory=list)
    jurisdictions: list[str] = Field(default_factory=lambda: ["EU"])
    retention_days: int | None = Field(default=None, ge=0)
    audit_public_key: Path | None = None
    evidence_dir: Path | None = None
    sign_key_file: Path | None = None

    @model_validator(mode="after")
    def _pack_needs_key(self) -> ContinuousSettings:
        if self.evidence_dir is not None and self.sign_key_file is None:
            raise ValueError("evidence_dir needs sign_key_file (the packs are signed)")
        return self
