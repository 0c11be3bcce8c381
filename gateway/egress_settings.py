"""The ``policy:`` section of the gateway config: the egress policy file and the process guard.

Read by :mod:`gateway.egress` (the policy bound to the config, the guard); the loader resolves
``file`` against the config file's directory, and :mod:`gateway.serving.reload` watches it.

```yaml
policy: {file: policy.yaml, guard: enforce}
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from gateway.config.base import FrozenSection

__all__ = ["PolicySettings"]


class PolicySettings(FrozenSection):
    """The ``policy:`` section: the egress policy file and the process guard.

    Attributes:
        file: Policy YAML file (relative paths are relative to the gateway config file).
        guard: Process egress guard mode (``enforce`` blocks, ``monitor`` only records).
    """

    file: Path
    guard: Literal["enforce", "monitor", "off"] = "enforce"
