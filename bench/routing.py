"""Routing benchmark: the same open-loop workload through each routing strategy, in one run.

Starts N simulated replicas (``vllm-sim --profile``, separate processes; or uses real ones with
``--backend-url``), one gateway process whose config has one model per strategy, all in front of
the same replicas, and optionally the vLLM project's router (``vllm-router``, PyPI) with the
policies asked for. For each strategy the replicas' prefix caches are reset, the workload is
replayed with the same Poisson arrival schedule, and the client measures TTFT and end-to-end
latency; the replicas' ``/metrics`` give the prefix-cache hit ratio of that run. ``oracle``
routes client-side to the replica whose cache holds the longest prefix of the prompt now
(``POST /sim/prefix`` on every replica; ties to the fewest in flight). ``partition`` is a
client-side reference: each new system prompt (or multi-turn ``user``) goes to the next replica
in turn and stays there (no load considered). ``--variant NAME=JSON`` also runs
``prefix_affinity`` through one more gateway whose ``routing:`` section is updated by JSON, so
that variants of the decision are compared on the same schedule in one run.

``--gateways 1 --gateways 3`` also runs every gateway strategy through 3 gateway processes
(pods) with the same config behind a client-side round-robin front (rows ``NAME@3pods``);
``--kv-events`` makes the simulators publish KV-cache events that every gateway follows, and
``--prompt-format tokens`` sends each chat as a completions prompt of the simulator's token ids
(exact matching against the events needs the prompt's token ids).

``--workload mixed`` is the flow-control benchmark (interactive and batch classes, with and
without flow control in one run): see ``bench/routing_mixed.py``.

Example::

    .venv/bin/python bench/routing.py --workload shared-prefix --load 0.7 \\
        --vllm-router .tools/vllm-router-venv/bin/vllm-router --json /tmp/routing.json

The rate is ``--load`` x the fleet's capacity, measured before each workload by a closed loop
of 32 streams per replica straight to the replicas (each request to the one with the fewest in
flight): with ``--capacity cold`` (the default) of prompts of the workload's length sharing
nothing, with ``--capacity workload`` of the workload's own requests (what the fleet serves of
this traffic under load-only routing, cache hits included); or with ``--capacity profile``
estimated from the profile (replicas / GPU time of a request with nothing cached,
``PerfProfile.request_cost_s`` at batch 32). With ``--backend-url`` give ``--rate`` in requests
per second instead.

Default workload sizes follow the scenario of llm-d's precise prefix-cache scheduling benchmark
("KV-Cache Wins You Can See", llm-d blog, 2025: 8 vLLM pods of Qwen3-32B, 150 customers with a
6,000-token system prompt each, 5 users per customer asking 1,200-token questions): the prefix
working set (150 x 6,000 = 900k tokens) is about three pods' KV cache (~280k tokens each for
Qwen3-32B at 256 KiB per token on two H100s) and well within the fleet's, so routing by load
alone thrashes every pod's cache while affinity keeps each prefix on one pod. Scaled to four
``qwen3-32b-h100`` replicas (1,791 blocks x 16 = 28,656 tokens each): G = 28 groups x S = 2,000
tokens = 56k tokens, twice one replica's cache and half the fleet's; Q = 400 (llm-d's 1:5
question to system prompt); P = 16 prompts per group (each group recurs throughout the run, as
llm-d's customers do, so that 1 request in 16 is a group's first). Multi-turn: U = 24 users x
R = 8 rounds, whose histories (500 + 8 x 324 tokens at the end) reach 2.6 replicas' caches.
The earlier defaults stay runnable: ``--groups 16 --prompts-per-group 8 --question-tokens 100
--users 16 --rounds 6 --capacity profile``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from relay_procs import BIN, Proc, free_port
from routing_load import Result, Target, Turn, WorkloadSpec, build, run
from routing_mixed import add_arguments as add_mixed_arguments
from routing_mixed import bench_mixed

from gateway.fleet import canonical_prompt
from vllm_sim.profiles import get_profile
from vllm_sim.tokens import count_text

KEY = "sg-bench-routing-key"
GATEWAY_STRATEGIES = ("least_outstanding", "round_robin", "prefix_affinity")
SERVED = "sim-model"
_COUNTER = re.compile(r"^vllm:(?:gpu_)?prefix_cache_(hits|queries)_total(?:\{.*\})? (\S+)$")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


async def _scrape(client: httpx.AsyncClient, urls: list[str]) -> tuple[float, float]:
    """Sum of the prefix-cache (hits, queries) counters over the replicas (new and old names)."""
    hits = queries = 0.0
    for url in urls:
        for attempt in range(5):  # a busy replica may drop a scrape: try again
            try:
                page = (await client.get(f"{url}/metrics")).text
                break
            except httpx.HTTPError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.2)
        for line in page.splitlines():
            m = _COUNTER.match(line)
            if m:
                if m.group(1) == "hits":
                    hits += float(m.group(2))
                else:
                    queries += float(m.group(2))
    return hits, queries


async def _reset(client: httpx.AsyncClient, urls: list[str], simulated: bool) -> None:
    """Empty every replica's prefix cache and wait until nothing runs (bounded)."""
    for url in urls:
        path = "/sim/reset" if simulated else "/reset_prefix_cache"
        # Real vLLM: needs VLLM_SERVER_DEV_MODE=1 on the server, else a 404 (ignored).
        for attempt in range(5):  # a busy replica may drop a connection: try again
            try:
                await client.post(f"{url}{path}")
                break
            except httpx.HTTPError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.2)
    if simulated:
        deadline = time.monotonic() + 60
        for url in urls:
            while (await client.get(f"{url}/sim/stats")).json()["running"] and (
                time.monotonic() < deadline
            ):
                await asyncio.sleep(0.05)


async def _measure_capacity(
    client: httpx.AsyncClient, urls: list[str], turns: list[Turn], output_tokens: int,
    per_replica: int,
) -> float:
    """The fleet's measured capacity for ``turns``, requests per second.

    Closed loop: ``per_replica`` streams per replica (the batch the profile estimate assumes)
    send ``turns`` in order (their arrival times ignored; a multi-turn round still waits for
    its previous answer), straight to the replicas, each to the one with the fewest requests in
    flight (the baseline strategy without a gateway); the capacity is the completed requests
    over the wall time. It includes whatever the machine adds to the simulated GPU time (CPU
    contention), which the profile estimate does not.
    """
    turns = [dataclasses.replace(t, at_s=0.0) for t in turns]
    slots = asyncio.Semaphore(per_replica * len(urls))

    class _Least(Target):
        def __init__(self) -> None:
            super().__init__()
            self.inflight = dict.fromkeys(urls, 0)

        async def pick(self, body: dict[str, Any]) -> str:
            await slots.acquire()
            url = min(urls, key=self.inflight.__getitem__)
            self.inflight[url] += 1
            return url

        def done(self, url: str) -> None:
            self.inflight[url] -= 1
            slots.release()

    await _reset(client, urls, True)
    results, wall = await run(client, turns, _Least(), SERVED, output_tokens, {})
    await _reset(client, urls, True)
    return sum(1 for r in results if r.ok) / wall if wall else 0.0


def _capacity_turns(
    workload: str, spec: WorkloadSpec, kind: str, prompt_tokens: int, streams: int, seed: int,
) -> list[Turn]:
    """The requests the capacity is measured with (see ``--capacity``).

    ``cold`` (and ``random``, which shares nothing anyway): two rounds of ``streams`` prompts
    of ``prompt_tokens`` sharing nothing.
    ``workload``: the workload itself (another seed); multi-turn with at least ``streams``
    users (same rounds, so the same history lengths) so that the closed loop can fill the
    streams, which the workload's own users (each waiting for its previous answer) cannot.
    """
    if kind == "cold" or workload == "random":  # random shares nothing: the same traffic
        cold = WorkloadSpec(system_tokens=prompt_tokens, question_tokens=0,
                            random_requests=2 * streams)
        return build("random", cold, 1.0, seed + 1000)
    if workload == "multi-turn":
        spec = dataclasses.replace(spec, users=max(spec.users, streams))
    return build(workload, spec, 1.0, seed + 1000)


class _Partition(Target):
    """Static partition: each new system prompt (or ``user``) goes to the next replica in turn.

    A reference, not a router: every group (or user) stays on one replica, so nothing is ever
    copied or evicted by routing and no load is considered; with groups of equal rate it is the
    affinity a perfect router could keep (what is left is the inevitable first request of each
    group and the cold prefills every other request meets).
    """

    def __init__(self, urls: list[str]) -> None:
        super().__init__()
        self.urls = urls
        self.owner: dict[str, str] = {}

    async def pick(self, body: dict[str, Any]) -> str:
        key = str(body.get("user") or (body["messages"][0]["content"] if "messages" in body
                                       else body["prompt"][:256]))
        url = self.owner.get(key)
        if url is None:
            url = self.owner[key] = self.urls[len(self.owner) % len(self.urls)]
        return url


class _RoundRobin(Target):
    """The front of N gateway pods: each request to the next gateway in turn (a Service)."""

    def __init__(self, urls: list[str]) -> None:
        super().__init__()
        self.urls = urls
        self.turn = 0

    async def pick(self, body: dict[str, Any]) -> str:
        self.turn += 1
        return self.urls[self.turn % len(self.urls)]


class _Oracle(Target):
    """Routes to the replica whose cache holds the longest prefix now; ties: fewest in flight."""

    def __init__(self, client: httpx.AsyncClient, urls: list[str]) -> None:
        super().__init__()
        self.client = client
        self.urls = urls
        self.inflight = dict.fromkeys(urls, 0)

    async def pick(self, body: dict[str, Any]) -> str:
        probes = await asyncio.gather(
            *(self.client.post(f"{u}/sim/prefix", json=body) for u in self.urls),
            return_exceptions=True,
        )
        cached = [p.json()["cached_tokens"] if isinstance(p, httpx.Response) else 0
                  for p in probes]
        best = max(range(len(self.urls)), key=lambda i: (cached[i], -self.inflight[self.urls[i]]))
        url = self.urls[best]
        self.inflight[url] += 1
        return url

    def done(self, url: str) -> None:
        self.inflight[url] -= 1


def _summary(results: list[Result], wall_s: float, hits: float, queries: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    ttft = [r.ttft_s for r in ok]
    e2e = [r.e2e_s for r in ok]
    return {
        "requests": len(results),
        "failed": len(results) - len(ok),
        "ttft_p50_s": _percentile(ttft, 50), "ttft_p90_s": _percentile(ttft, 90),
        "ttft_p99_s": _percentile(ttft, 99),
        "e2e_p50_s": _percentile(e2e, 50), "e2e_p90_s": _percentile(e2e, 90),
        "e2e_p99_s": _percentile(e2e, 99),
        "output_tok_s": sum(r.output_tokens for r in ok) / wall_s if wall_s else 0.0,
        "hit_ratio": hits / queries if queries else float("nan"),
        "wall_s": wall_s,
        # Per request, in the workload's order (failed ones: null), for analysis of the tails.
        "ttft_each_s": [round(r.ttft_s, 4) if r.ok else None for r in results],
    }


def _gateway_config(
    urls: list[str], port: int, strategies: list[str], routing: dict[str, Any]
) -> dict[str, Any]:
    models = [
        {"name": f"route-{s}", "served_model_name": SERVED, "strategy": s,
         "replicas": [{"url": u} for u in urls]}
        for s in strategies if s in GATEWAY_STRATEGIES
    ]
    cfg: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "models": models,
        "keys": [{"id": "bench-routing", "sha256": hashlib.sha256(KEY.encode()).hexdigest(),
                  "models": [m["name"] for m in models]}],
        "health": {"active": False},
        "logging": {"access_log": False},
    }
    if routing:
        cfg["routing"] = routing
    return cfg


def _print(workload: str, table: dict[str, dict[str, Any]], params: dict[str, Any]) -> None:
    base = table.get("least_outstanding")
    print(f"\n## {workload}  ({', '.join(f'{k}={v}' for k, v in params.items())})")
    cols = [("ttft_p50_s", "TTFT p50"), ("ttft_p90_s", "TTFT p90"), ("ttft_p99_s", "TTFT p99"),
            ("e2e_p50_s", "e2e p50"), ("e2e_p90_s", "e2e p90"), ("output_tok_s", "out tok/s"),
            ("hit_ratio", "hit ratio")]
    print("| strategy | " + " | ".join(c[1] for c in cols) + " | failed |")
    print("|---" * (len(cols) + 2) + "|")
    for name, row in table.items():
        cells = []
        for key, _ in cols:
            value = row[key]
            ratio = ""
            if base and name != "least_outstanding" and base[key] and base[key] == base[key]:
                ratio = f" ({value / base[key]:.2f}x)"
            cells.append(f"{value:.3f}{ratio}" if key != "output_tok_s" else f"{value:.0f}{ratio}")
        print(f"| {name} | " + " | ".join(cells) + f" | {row['failed']} |")


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    spec = WorkloadSpec(
        groups=args.groups, prompts_per_group=args.prompts_per_group,
        system_tokens=args.system_tokens, question_tokens=args.question_tokens,
        output_tokens=args.output_tokens, users=args.users, rounds=args.rounds,
        turn_tokens=args.turn_tokens, user_system_tokens=args.user_system_tokens,
        random_requests=args.random_requests,
    )
    procs: list[Proc] = []
    workdir = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    report: dict[str, Any] = {"args": vars(args), "workloads": {}}
    try:
        simulated = not args.backend_url
        if simulated:
            events: list[dict[str, Any]] = []
            for _ in range(args.replicas):
                port = free_port()
                argv = [str(BIN / "vllm-sim"), "--port", str(port), "--model", SERVED,
                        "--profile", args.profile, "--time-scale", str(args.time_scale),
                        "--max-model-len", "200000"]
                if args.num_gpu_blocks:
                    argv += ["--num-gpu-blocks", str(args.num_gpu_blocks)]
                if args.kv_events:
                    pub = f"tcp://127.0.0.1:{free_port()}"
                    replay = f"tcp://127.0.0.1:{free_port()}"
                    argv += ["--kv-events-config", json.dumps(
                        {"enable_kv_cache_events": True, "endpoint": pub,
                         "replay_endpoint": replay})]
                    events.append({"replica": f"http://127.0.0.1:{port}", "endpoint": pub,
                                   "replay_endpoint": replay})
                procs.append(Proc(f"vllm-sim:{port}", argv, port, "/health"))
            urls = [p.url for p in procs]
        else:
            urls = [u.rstrip("/") for u in args.backend_url]
        port = free_port()
        cfg_path = workdir / "gateway.yaml"
        routing = json.loads(args.routing_json) if args.routing_json else {}
        if simulated and "chars_per_token" not in routing and "tokenizer_file" not in routing:
            # The gateway sizes its prefix index from the replica's KV capacity in tokens and
            # estimates prompt tokens from characters: tell it the simulator's tokenization,
            # as a deployment sets ``chars_per_token`` (or a tokenizer) for its model.
            routing["chars_per_token"] = round(_chars_per_token(spec, args.workload, args.seed), 2)
        if simulated and args.kv_events:
            routing["kv_events"] = events
        cfg_path.write_text(yaml.safe_dump(_gateway_config(urls, port, args.strategy, routing)))
        exe = BIN / "gateway"
        gw_argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]
        procs.append(Proc("gateway", [*gw_argv, "serve", "--config", str(cfg_path)], port,
                          "/healthz"))
        gateway = procs[-1].url
        # ``--gateways N``: N gateway processes (pods) with the same config behind a
        # round-robin front, for each N > 1 asked for (N = 1 is the gateway above).
        pods: dict[int, list[str]] = {}
        for n in sorted(set(args.gateways) - {1}):
            pod_urls = []
            for k in range(n):
                pport = free_port()
                pcfg = workdir / f"gateway-pods{n}-{k}.yaml"
                pcfg.write_text(yaml.safe_dump(
                    _gateway_config(urls, pport, args.strategy, routing)))
                procs.append(Proc(f"gateway:pods{n}-{k}",
                                  [*gw_argv, "serve", "--config", str(pcfg)], pport, "/healthz"))
                pod_urls.append(procs[-1].url)
            pods[n] = pod_urls
        # ``--variant NAME=JSON``: one more gateway per variant, ``prefix_affinity`` only, its
        # ``routing:`` section the base one updated with JSON (weights merged), so that variants
        # of the decision are compared on the same schedule in the same run.
        variants: dict[str, str] = {}
        for name, update in args.variant:
            vrouting = variant_routing(routing, update)
            vport = free_port()
            vcfg = workdir / f"gateway-{name}.yaml"
            vcfg.write_text(yaml.safe_dump(
                _gateway_config(urls, vport, ["prefix_affinity"], vrouting)))
            procs.append(Proc(f"gateway:{name}", [*gw_argv, "serve", "--config", str(vcfg)],
                              vport, "/healthz"))
            variants[f"prefix_affinity:{name}"] = procs[-1].url
        peers: dict[str, str] = dict(p.split("=", 1) for p in args.peer_router)
        if args.vllm_router:
            for policy in args.vllm_router_policy:
                rport = free_port()
                # Its Prometheus exporter defaults to the fixed port 29000: give it a free one.
                argv = [args.vllm_router, "--host", "127.0.0.1", "--port", str(rport),
                        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                        "--policy", policy, "--worker-urls", *urls]
                procs.append(Proc(f"vllm-router:{policy}", argv, rport, "/health"))
                peers[f"vllm-router:{policy}"] = procs[-1].url
        if simulated:
            profile = get_profile(args.profile) if not args.profile.endswith(".json") else None
        else:
            profile = None
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0),
                                     limits=httpx.Limits(max_connections=2000)) as client:
            for workload in args.workload:
                prompt = {"shared-prefix": spec.system_tokens + spec.question_tokens,
                          "random": spec.system_tokens + spec.question_tokens,
                          "multi-turn": spec.user_system_tokens
                          + (spec.rounds + 1) / 2 * (spec.turn_tokens + spec.output_tokens)
                          }[workload]
                estimate = measured = None
                if profile is not None:
                    cost = profile.request_cost_s(int(prompt), spec.output_tokens, 32)
                    estimate = len(urls) / (cost * args.time_scale)
                if simulated and args.capacity in ("cold", "workload") and not args.rate:
                    cap_turns = _capacity_turns(workload, spec, args.capacity, int(prompt),
                                                32 * len(urls), args.seed)
                    measured = await _measure_capacity(client, urls, cap_turns,
                                                       spec.output_tokens, 32)
                    print(f"  {workload}: measured capacity {measured:.2f} req/s "
                          f"(profile estimate {estimate or float('nan'):.2f})", file=sys.stderr)
                if args.rate:
                    rate = args.rate
                elif measured is not None:
                    rate = args.load * measured
                elif estimate is not None:
                    rate = args.load * estimate
                else:
                    raise SystemExit("--rate is required with --backend-url or a profile file")
                turns = build(workload, spec, rate, args.seed)
                table: dict[str, dict[str, Any]] = {}
                targets: dict[str, tuple[Any, str, dict[str, str]]] = {}
                auth = {"authorization": f"Bearer {KEY}"}
                for s in args.strategy:
                    if s == "oracle":
                        if simulated:
                            targets[s] = (_Oracle(client, urls), SERVED, {})
                    elif s == "partition":
                        targets[s] = (_Partition(urls), SERVED, {})
                    else:
                        if 1 in args.gateways:
                            targets[s] = (Target(gateway), f"route-{s}", auth)
                        for n, pod_urls in pods.items():
                            targets[f"{s}@{n}pods"] = (_RoundRobin(pod_urls), f"route-{s}", auth)
                for name, url in variants.items():
                    targets[name] = (Target(url), "route-prefix_affinity", auth)
                for name, url in peers.items():
                    targets[name] = (Target(url), SERVED, {})
                for name, (target, model, headers) in targets.items():
                    await _reset(client, urls, simulated)
                    h0, q0 = await _scrape(client, urls)
                    results, wall = await run(client, turns, target, model, spec.output_tokens,
                                              headers, args.prompt_format)
                    h1, q1 = await _scrape(client, urls)
                    table[name] = _summary(results, wall, h1 - h0, q1 - q0)
                    print(f"  {workload} {name}: done in {wall:.1f}s", file=sys.stderr)
                params = {"replicas": len(urls), "rate_rps": round(rate, 2),
                          "chars_per_token": routing.get("chars_per_token"),
                          "load": args.load if not args.rate else None,
                          "capacity": args.capacity if not args.rate else None,
                          "capacity_rps": round(measured, 2) if measured else None,
                          "estimate_rps": round(estimate, 2) if estimate else None,
                          "requests": len(turns), "profile": args.profile if simulated else None,
                          "time_scale": args.time_scale, "O": spec.output_tokens}
                params.update(_workload_params(workload, spec))
                _print(workload, table, params)
                report["workloads"][workload] = {"params": params, "results": table}
    finally:
        for p in reversed(procs):
            p.stop()
    return report


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """One ``--variant NAME=JSON``: the name and the JSON object updating ``routing:``.

    Raises:
        argparse.ArgumentTypeError: No name, no ``=``, or the JSON is not an object.
    """
    name, sep, update = text.partition("=")
    if not name or not sep:
        raise argparse.ArgumentTypeError(f"expected NAME=JSON, got {text!r}")
    try:
        doc = json.loads(update)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{name}: not JSON ({exc.msg}): {update!r}") from exc
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError(f"{name}: the JSON must be an object, got {update!r}")
    return name, doc


def variant_routing(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """The ``routing:`` section of a ``--variant`` gateway: ``base`` updated by ``update``.

    Top-level keys of ``update`` replace ``base``'s, except ``weights``, which are merged (a
    variant names only the weights it changes). ``base`` is not modified.
    """
    merged = {**base, **update}
    if "weights" in base and "weights" in update:
        merged["weights"] = {**base["weights"], **update["weights"]}
    return merged


def _chars_per_token(spec: WorkloadSpec, workloads: list[str], seed: int) -> float:
    """Characters of the gateway's canonical prompt per simulator token, over the workloads.

    The simulator counts a word (or punctuation mark) as one token (``vllm_sim.tokens``); the
    workloads' words are ``g3s1234``-like, ~7.5 characters with the space, where English text
    with a BPE tokenizer is ~4 (the gateway's default).
    """
    chars = tokens = 0
    # ``random`` shares nothing (its words are longer): the index matters for the others.
    sharing = [w for w in workloads if w != "random"] or workloads
    for workload in sharing:
        for turn in build(workload, spec, 1.0, seed)[:32]:
            text = canonical_prompt({"messages": turn.messages}) or ""
            chars += len(text)
            tokens += sum(count_text(m["content"]) for m in turn.messages)
    return chars / tokens if tokens else 4.0


def _workload_params(workload: str, spec: WorkloadSpec) -> dict[str, Any]:
    if workload == "shared-prefix":
        return {"G": spec.groups, "P": spec.prompts_per_group, "S": spec.system_tokens,
                "Q": spec.question_tokens}
    if workload == "multi-turn":
        return {"U": spec.users, "R": spec.rounds, "S": spec.user_system_tokens,
                "Q": spec.turn_tokens}
    return {"N": spec.random_requests, "prompt": spec.system_tokens + spec.question_tokens}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags of the benchmark (``--help``); ``--variant`` values are parsed to pairs.

    Raises:
        SystemExit: A flag is malformed (argparse's usage error, exit status 2).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", action="append",
                    choices=["shared-prefix", "multi-turn", "random", "mixed"])
    ap.add_argument("--strategy", action="append",
                    choices=[*GATEWAY_STRATEGIES, "oracle", "partition"])
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--profile", default="qwen3-32b-h100")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--num-gpu-blocks", type=int, default=None)
    ap.add_argument("--load", type=float, default=0.7, help="fraction of fleet capacity")
    ap.add_argument("--capacity", choices=["cold", "workload", "profile"], default="cold",
                    help="fleet capacity: measured closed-loop on the replicas with prompts of "
                         "the workload's length sharing nothing (cold), or with the workload's "
                         "own requests (workload), or estimated from the profile")
    ap.add_argument("--rate", type=float, default=None, help="requests/s (overrides --load)")
    ap.add_argument("--seed", type=int, default=1)
    # Defaults: the scenario of llm-d's precise-scheduling benchmark scaled to this fleet (see
    # the module docstring); the earlier defaults were G=16, P=8, Q=100, U=16, R=6.
    ap.add_argument("--groups", type=int, default=28)
    ap.add_argument("--prompts-per-group", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=2000)
    ap.add_argument("--question-tokens", type=int, default=400)
    ap.add_argument("--output-tokens", type=int, default=24)
    ap.add_argument("--users", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--turn-tokens", type=int, default=300)
    ap.add_argument("--user-system-tokens", type=int, default=500)
    ap.add_argument("--random-requests", type=int, default=96)
    ap.add_argument("--backend-url", action="append", default=[])
    ap.add_argument("--peer-router", action="append", default=[], metavar="NAME=URL")
    ap.add_argument("--vllm-router", default=None, help="path of the vllm-router binary")
    ap.add_argument("--vllm-router-policy", action="append", default=None)
    ap.add_argument("--routing-json", default=None, help="gateway 'routing:' section as JSON")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                    type=parse_variant,
                    help="also run prefix_affinity with the routing section updated by JSON "
                         "(its own gateway), e.g. 'p25={\"weights\": {\"prefill\": 0.25}}'")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--gateways", type=int, action="append", default=None,
                    help="gateway pods behind a round-robin front (repeat: --gateways 1 "
                         "--gateways 3 compares both in one run)")
    ap.add_argument("--kv-events", action="store_true",
                    help="simulators publish KV-cache events; the gateways follow them")
    ap.add_argument("--prompt-format", choices=["chat", "tokens"], default="chat",
                    help="tokens: send each chat as a completions prompt of the simulator's "
                         "token ids (exact KV-event matching needs token ids)")
    add_mixed_arguments(ap)
    args = ap.parse_args(argv)
    names = [name for name, _ in args.variant]
    if len(set(names)) != len(names):
        ap.error(f"--variant names must be unique, got {names}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run the benchmark, print the tables (and write ``--json``)."""
    args = parse_args(argv)
    if args.workload == ["mixed"]:  # flow control with and without (bench/routing_mixed.py)
        args.replicas = args.replicas if args.replicas != 4 else 2
        args.profile = args.profile if args.profile != "qwen3-32b-h100" else "llama-3.1-8b-h100"
        args.time_scale = args.time_scale if args.time_scale != 1.0 else 10.0
        mixed = asyncio.run(bench_mixed(args))
        if args.json:
            Path(args.json).write_text(json.dumps(mixed, indent=2, default=str))
        return 0
    args.workload = args.workload or ["shared-prefix"]
    args.strategy = args.strategy or [*GATEWAY_STRATEGIES, "oracle"]
    args.vllm_router_policy = args.vllm_router_policy or ["cache_aware", "round_robin"]
    args.gateways = args.gateways or [1]
    report = asyncio.run(_bench(args))
    report["note"] = "shared 2-core machine; every process (replicas, gateway, client) competes"
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
