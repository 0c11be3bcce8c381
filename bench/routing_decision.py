"""Micro-benchmark of the ``prefix_affinity`` decision: cost per request and index memory.

Fills a pool's prefix index with ``--blocks`` blocks per replica (``--replicas`` replicas; the
issue's target case is 100,000 x 8), gives every replica fresh scraped signals, then times
``Pool.pick`` for prompts that share a prefix with indexed entries. Two figures per run:

* **decision**: ``Pool.pick(candidates, hint=...)`` (match against the index, load estimate,
  scoring, index update), with the prompt already hashed;
* **hint**: rendering the body to its canonical prompt and hashing its blocks
  (``Pool.route_hint``), which grows with the prompt length (``--prompt-chars``).

Each figure is reported as wall time and as thread CPU time (``CLOCK_THREAD_CPUTIME_ID``): on a
shared, overloaded machine the wall-time tail is dominated by the scheduler taking the core away,
which the CPU time excludes.

Memory: ``tracemalloc`` difference before and after filling the index, per (replica, block).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
import tracemalloc

from gateway.fleet import RoutingSettings
from gateway.fleet.model_settings import ModelSettings, ReplicaSettings
from gateway.fleet.replica_metrics import ReplicaSignals
from gateway.routing import Pool


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def main() -> None:
    """Run the micro-benchmark and print its figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=100_000, help="index blocks per replica")
    ap.add_argument("--prompt-chars", type=int, default=8_000)
    ap.add_argument("--iterations", type=int, default=20_000)
    args = ap.parse_args()

    routing = RoutingSettings(index_blocks=args.blocks)
    model = ModelSettings(
        name="m", strategy="prefix_affinity",
        replicas=[ReplicaSettings(url=f"http://10.0.0.{i}:8000") for i in range(args.replicas)],
    )
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    pool = Pool(model, cooldown_s=10.0, routing=routing)
    affinity = pool.affinity
    assert affinity is not None
    per_prompt = 64
    for r in range(args.replicas):
        for p in range(args.blocks // per_prompt):
            base = (r * 10_000_000 + p) * 1000
            affinity.index.insert(r, list(range(base, base + per_prompt)))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    mem = sum(s.size_diff for s in after.compare_to(before, "filename"))
    entries = sum(affinity.index.size(r) for r in range(args.replicas))

    now = time.monotonic()
    for i, rep in enumerate(pool.replicas):
        rep.observe(ReplicaSignals(at=now + 3600, waiting=float(i % 3), running=4.0,
                                   kv_usage=0.5))
    sys_prompt = "You are a helpful assistant. " * (args.prompt_chars // 29 + 1)
    bodies = [
        {"messages": [{"role": "system", "content": sys_prompt[: args.prompt_chars]},
                      {"role": "user", "content": f"question number {i}"}]}
        for i in range(64)
    ]
    hints = [pool.route_hint(b, ()) for b in bodies]
    decide: list[float] = []
    decide_cpu: list[float] = []
    hint_cost: list[float] = []
    hint_cpu: list[float] = []
    clock = time.perf_counter_ns
    cpu = time.thread_time_ns
    for i in range(args.iterations):
        body = bodies[i % len(bodies)]
        t0, c0 = clock(), cpu()
        hint = pool.route_hint(body, ())
        t1, c1 = clock(), cpu()
        chosen = pool.pick(pool.replicas, hint=hints[i % len(hints)])
        t2, c2 = clock(), cpu()
        assert chosen is not None and hint is not None
        hint_cost.append((t1 - t0) / 1000)
        hint_cpu.append((c1 - c0) / 1000)
        decide.append((t2 - t1) / 1000)
        decide_cpu.append((c2 - c1) / 1000)
    blocks = len(hints[0].hashes) if hints[0] else 0
    print(f"replicas={args.replicas} index blocks/replica={args.blocks} "
          f"prompt={args.prompt_chars} chars ({blocks} blocks of {routing.block_chars})")
    for label, wall, used in (("decision (pick)", decide, decide_cpu),
                              ("hint (render+hash)", hint_cost, hint_cpu)):
        print(f"{label}: wall p50 {statistics.median(wall):.1f} us p99 "
              f"{_percentile(wall, 99):.1f} us | cpu p50 {statistics.median(used):.1f} us "
              f"p99 {_percentile(used, 99):.1f} us")
    print("target: decision p99 < 50 us")
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"index memory: {mem / 2**20:.1f} MiB for {entries} entries "
          f"({mem / max(entries, 1):.0f} B per replica-block)")
    print("note: shared 2-core machine; figures vary with other load")


if __name__ == "__main__":
    main()
