"""vllm_sim: a SIMULATOR of vLLM's OpenAI-compatible server (for tests, demos and benchmarks).

It is not vLLM and runs no model: it answers with deterministic text that mixes ASCII and
multi-byte UTF-8, with configurable time to first token, inter-token latency and length, and
injectable faults (``POST /sim/faults``). Every response carries ``x-simulator: vllm-sim``.

Public API::

    from vllm_sim import SimConfig, FaultSpec, create_app
    app = create_app(SimConfig(models=["m"], ttft_s=0.05))   # an ASGI app for uvicorn
"""

from vllm_sim.app import SimApp, create_app
from vllm_sim.config import FaultMode, FaultSpec, SimConfig
from vllm_sim.errors import BadRequest, ModelNotFound, SimError

__all__ = [
    "BadRequest",
    "FaultMode",
    "FaultSpec",
    "ModelNotFound",
    "SimApp",
    "SimConfig",
    "SimError",
    "create_app",
]
