"""The shared base of the gateway config's section models, and the value checks sections share.

A leaf: it imports nothing from ``gateway``, so a feature package's ``settings`` module can
import it without importing the root model (:mod:`gateway.config.settings`), which imports
every section. (The sub-package cores ``audit``, ``quotas``, ``keystore`` and ``flow`` import
nothing from ``gateway.config``; their sections define the same base locally.)
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

__all__ = ["ENV_NAME", "FrozenSection"]

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""An environment variable's name (``api_key_env``, ``${NAME}`` references)."""


class FrozenSection(BaseModel):
    """A config section: immutable once validated, and an unknown key is an error (a typo)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
