"""``GET /metrics`` in the Prometheus text exposition format (version 0.0.4).

Gauge and counter names are vLLM's (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``, ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
``vllm:request_success_total``), labelled with ``model_name`` and ``engine``.
"""

from __future__ import annotations

from vllm_sim.config import SimConfig
from vllm_sim.state import SimState

KV_CACHE_SEQS = 256
"""Requests that fill the simulated KV cache: ``kv_cache_usage_perc = running / 256`` (max 1)."""

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def _labels(model: str, **extra: str) -> str:
    pairs = {"engine": "0", "model_name": model, **extra}
    return ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items()))


def render(config: SimConfig, state: SimState) -> bytes:
    """The metrics page for every served model."""
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        sample_name = f"{name}_total" if kind == "counter" else name
        lines.extend(f"{sample_name}{{{labels}}} {value:.1f}" for labels, value in samples)

    models = config.models
    family(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        [(_labels(m), float(state.running_by_model[m])) for m in models],
    )
    family(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        [(_labels(m), 0.0) for m in models],
    )
    family(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        [(_labels(m), min(1.0, state.running_by_model[m] / KV_CACHE_SEQS)) for m in models],
    )
    family(
        "vllm:prompt_tokens",
        "counter",
        "Number of prefill tokens processed.",
        [(_labels(m), float(state.prompt_tokens_total[m])) for m in models],
    )
    family(
        "vllm:generation_tokens",
        "counter",
        "Number of generation tokens processed.",
        [(_labels(m), float(state.generation_tokens_total[m])) for m in models],
    )
    family(
        "vllm:request_success",
        "counter",
        "Count of successfully processed requests.",
        [
            (_labels(m, finished_reason=reason), float(state.success_total[(m, reason)]))
            for m in models
            for reason in ("stop", "length", "abort", "error", "repetition")
        ],
    )
    return ("\n".join(lines) + "\n").encode()
