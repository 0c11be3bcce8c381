"""``GET /metrics`` in the Prometheus text exposition format (version 0.0.4).

Gauge and counter names are vLLM's (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``, ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
``vllm:request_success_total``), labelled with ``model_name`` and ``engine``.

With the engine model (``SimConfig.profile``) the queue and KV gauges come from the engine, and
the page adds the prefix-cache counters ``vllm:prefix_cache_queries_total`` and
``vllm:prefix_cache_hits_total`` (tokens; vLLM V1 declares ``vllm:prefix_cache_queries`` and
``prometheus_client`` appends ``_total``) and ``vllm:cache_config_info`` (labels ``block_size``,
``num_gpu_blocks``, value 1), as vLLM V1's ``PrometheusStatLogger`` does. The engine serves
every model name of the app from one cache, so its figures are reported on the first model.
"""

from __future__ import annotations

from vllm_sim.config import SimConfig
from vllm_sim.engine import Engine
from vllm_sim.state import SimState

KV_CACHE_SEQS = 256
"""Requests that fill the simulated KV cache: ``kv_cache_usage_perc = running / 256`` (max 1)."""

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def _labels(model: str, **extra: str) -> str:
    pairs = {"engine": "0", "model_name": model, **extra}
    return ",".join(f'{k}="{v}"' for k, v in sorted(pairs.items()))


def render(config: SimConfig, state: SimState, engine: Engine | None = None) -> bytes:
    """The metrics page for every served model (engine figures when ``engine`` is given)."""
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        sample_name = f"{name}_total" if kind == "counter" else name
        lines.extend(f"{sample_name}{{{labels}}} {value:.1f}" for labels, value in samples)

    models = config.models
    if engine is None:
        running = [(_labels(m), float(state.running_by_model[m])) for m in models]
        waiting = [(_labels(m), 0.0) for m in models]
        kv = [(_labels(m), min(1.0, state.running_by_model[m] / KV_CACHE_SEQS)) for m in models]
    else:
        first = _labels(models[0])
        running = [(first, float(len(engine.running)))]
        waiting = [(first, float(len(engine.waiting)))]
        kv = [(first, engine.kv_usage)]
    family(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        running,
    )
    family(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        waiting,
    )
    family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", kv)
    if engine is not None:
        first = _labels(models[0])
        family(
            "vllm:prefix_cache_queries",
            "counter",
            "Prefix cache queries, in terms of number of queried tokens.",
            [(first, float(engine.queries_total))],
        )
        family(
            "vllm:prefix_cache_hits",
            "counter",
            "Prefix cache hits, in terms of number of cached tokens.",
            [(first, float(engine.hits_total))],
        )
        family(
            "vllm:num_preemptions",
            "counter",
            "Cumulative number of preemption from the engine.",
            [(first, float(engine.preemptions_total))],
        )
        p = engine.profile
        info = _labels(
            models[0], block_size=str(p.block_size), num_gpu_blocks=str(p.num_gpu_blocks)
        )
        family(
            "vllm:cache_config_info",
            "gauge",
            "Information of the LLMEngine CacheConfig",
            [(info, 1.0)],
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
