"""litellm without hidden egress: switch its remote fetches and telemetry off, then import it.

litellm (a backend of kind ``litellm``) is imported lazily, only when such a backend is
configured. On import and on first use it would otherwise fetch, from the internet, its model
cost map, Anthropic beta-header table, autorouter presets, policy templates and blog feed, and
tokenizers may come from the Hugging Face Hub (shared/FORMATS.md: "``import litellm`` fetches a
model cost map ... unless ``LITELLM_LOCAL_MODEL_COST_MAP`` is set"). :data:`LITELLM_OFFLINE_ENV`
turns every such switch to its local, bundled copy; the process guard stays on regardless, so a
switch missed here (a newer litellm) shows up as a recorded, blocked egress attempt.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import MutableMapping
from types import MappingProxyType, ModuleType
from typing import Final

#: Environment switches set before litellm is imported (values are forced, not defaulted).
LITELLM_OFFLINE_ENV: Final = MappingProxyType({
    "LITELLM_OFFLINE_MODE": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_TELEMETRY": "False",
    "LITELLM_DONT_SHOW_FEEDBACK_BOX": "True",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
})


def litellm_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set litellm's offline switches in ``environ`` (default: ``os.environ``).

    tiktoken encodings come from the copy bundled with litellm (it points ``TIKTOKEN_CACHE_DIR``
    there unless ``CUSTOM_TIKTOKEN_CACHE_DIR`` is set: pre-seed that directory in air-gapped
    images if you override it).

    Args:
        environ: the mapping to change; ``os.environ`` when ``None``.

    Returns:
        The variables that were changed, with their new values.
    """
    env = os.environ if environ is None else environ
    changed: dict[str, str] = {}
    for name, value in LITELLM_OFFLINE_ENV.items():
        if env.get(name) != value:
            env[name] = value
            changed[name] = value
    return changed


def import_litellm() -> ModuleType:
    """Switch litellm's hidden egress off in ``os.environ``, import it and return the module.

    Import it only when a ``litellm`` backend is configured (the import takes seconds and
    changes global state: environment, logging). Install the process guard first, so an
    import-time connection attempt is blocked and recorded.

    Raises:
        ImportError: litellm is not installed (the ``litellm`` extra).
    """
    litellm_env()
    module = importlib.import_module("litellm")
    # Module-level switches of litellm (present in the versions we support).
    for attr, value in (("telemetry", False), ("suppress_debug_info", True)):
        if hasattr(module, attr):
            setattr(module, attr, value)
    return module
