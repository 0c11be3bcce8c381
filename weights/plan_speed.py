"""Speed of a planned layout, as roofline arithmetic (estimates, not measurements).

Formulas (each is printed next to its figure):

* ridge point = dense peak FLOP/s / memory bandwidth (FLOP per byte). The peak is the FP8 one
  when the weights are 1 byte and the GPU has FP8 tensor cores, else BF16.
* Decode reads every weight once per step: arithmetic intensity over the weights is
  2 x active parameters x batch / weight bytes read, so decode is memory-bound until
  batch = ridge x bytes per parameter x read / (2 x active) parameters, read = total - untied
  input embedding (H100 SXM, BF16 dense: 989 TFLOP/s / 3.35 TB/s = 295 FLOP/byte -> batch
  ~295).
* Decode step of one replica at batch B: max(bytes read / (TP x bandwidth),
  2 x active parameters x B / (TP x peak)); bytes read = weights read (without the untied
  input embedding, a row lookup) + B x KV per sequence (full context, the worst case). For
  MoE the weights read count the routed experts touched by B tokens: E x (1 - (1 - k/E)^B)
  of E. Pipeline stages run one after another for a token,
  so PP adds no bandwidth to a step. Tokens/s per replica = B / step.
* Prefill of 1,000 prompt tokens at peak compute: 2 x active parameters x 1,000 / (TP x peak);
  attention FLOPs (quadratic in the prompt) are left out.

Real engines reach a fraction of these peaks (kernel efficiency, TP all-reduce, scheduling).
"""

from __future__ import annotations

from weights.plan_types import Layout, Plan
from weights.sizing import Figure


def weights_read(plan: Plan, batch: int) -> float:
    """Bytes of weights one decode step of ``batch`` sequences reads (all replica ranks)."""
    m = plan.model
    untouched = 0.0
    if m.experts and m.experts_per_tok:
        touched = 1 - (1 - m.experts_per_tok / m.experts) ** batch
        untouched = m.routed_expert_params * (1 - touched)
    return (m.params - m.embedding_params - untouched) * m.weight_el_bytes


def speed(plan: Plan, lay: Layout) -> tuple[Figure, ...]:
    """Roofline figures of ``lay`` (labelled estimates, each with its formula)."""
    m, gpu = plan.model, plan.cluster.gpu
    peak = gpu.peak_flops(m.weight_el_bytes)
    peak_name = "FP8" if peak == gpu.fp8_flops and m.weight_el_bytes <= 1 else "BF16"
    bw = gpu.bandwidth_bytes_s
    ridge = peak / bw
    crossover = ridge * m.weight_el_bytes * (m.params - m.embedding_params) / (
        2 * m.active_params)
    b = lay.seqs_per_replica
    read = weights_read(plan, b) + b * m.kv_per_seq
    t_mem = read / (lay.tp * bw)
    t_cmp = 2 * m.active_params * b / (lay.tp * peak)
    step = max(t_mem, t_cmp)
    bound = "memory" if t_mem >= t_cmp else "compute"
    prefill = 2 * m.active_params * 1000 / (lay.tp * peak)
    est = "estimate: "
    return (
        Figure("peak compute", peak, "FLOP/s",
               f"{gpu.name} dense {peak_name} ({gpu.source}, {gpu.date})"),
        Figure("memory bandwidth", bw, "bytes/s", f"{gpu.name} ({gpu.source})"),
        Figure("ridge point", ridge, "FLOP/byte", est + "peak FLOP/s / bandwidth"),
        Figure("decode memory-bound below batch", crossover, "sequences",
               est + "ridge x bytes per parameter x read / (2 x active) parameters "
                     "(weights only; KV reads push it higher)"),
        Figure("planned batch per replica", b, "sequences",
               f"ceil(concurrency / {lay.replicas} replicas): {bound}-bound at this batch"),
        Figure("bytes read per decode step", read, "bytes",
               est + "weights read + batch x KV per sequence (full context)"),
        Figure("decode step", step, "seconds",
               est + f"max(bytes read / (TP {lay.tp} x bandwidth), "
                     f"2 x active params x batch / (TP {lay.tp} x peak))"),
        Figure("decode tokens/s per replica", b / step, "tokens/s",
               est + "batch / decode step"),
        Figure("decode tokens/s per sequence", 1 / step, "tokens/s", est + "1 / decode step"),
        Figure("decode tokens/s, all replicas", lay.replicas * b / step, "tokens/s",
               est + f"{lay.replicas} replicas x tokens/s per replica"),
        Figure("prefill per 1,000 prompt tokens", prefill, "seconds",
               est + f"2 x active params x 1000 / (TP {lay.tp} x peak); attention FLOPs "
                     "left out"),
    )


def _per_sequence_tokens_s(plan: Plan, lay: Layout) -> float:
    for f in speed(plan, lay):
        if f.name == "decode tokens/s per sequence":
            return f.value
    raise KeyError("decode tokens/s per sequence")


def by_goal(plan: Plan, layouts: list[Layout], goal: str) -> tuple[list[Layout], str]:
    """Rank fitting ``layouts`` by ``goal`` and say why the first wins.

    ``throughput``: most decode tokens/s over all replicas; ``latency``: most decode tokens/s
    per sequence at the stated concurrency; ``cost``: fewest GPUs per replica, then the most
    tokens/s. Ties keep the given (structural) order. Estimates: :func:`speed`.

    Returns:
        (ranked layouts, one line naming the goal, the winner's figure and the runner-up's).
    """
    def line(lay: Layout) -> str:
        return (f"TP {lay.tp} x PP {lay.pp} x {lay.replicas} replica(s): "
                f"{aggregate_tokens_s(plan, lay):,.0f} tok/s all replicas, "
                f"{_per_sequence_tokens_s(plan, lay):,.1f} tok/s per sequence, "
                f"{lay.gpus_per_replica} GPU(s) per replica")

    if goal == "latency":
        ranked = sorted(layouts, key=lambda lay: -_per_sequence_tokens_s(plan, lay))
        what = (f"goal latency (tok/s per sequence at concurrency {plan.work.concurrency})")
    elif goal == "cost":
        ranked = sorted(layouts, key=lambda lay: (lay.gpus_per_replica,
                                                  -aggregate_tokens_s(plan, lay)))
        what = "goal cost (fewest GPUs per replica, then tok/s)"
    else:
        ranked = sorted(layouts, key=lambda lay: -aggregate_tokens_s(plan, lay))
        what = f"goal throughput (decode tok/s of all replicas at concurrency " \
               f"{plan.work.concurrency})"
    why = f"{what}: chose {line(ranked[0])}"
    if len(ranked) > 1:
        why += f"; next {line(ranked[1])} (estimates)"
    return ranked, why


def aggregate_tokens_s(plan: Plan, lay: Layout) -> float:
    """Estimated decode tokens/s of all replicas of ``lay`` (for ranking tables)."""
    for f in speed(plan, lay):
        if f.name == "decode tokens/s, all replicas":
            return f.value
    raise KeyError("decode tokens/s, all replicas")
