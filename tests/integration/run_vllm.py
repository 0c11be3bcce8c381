"""Start real vLLM (CPU) replicas on loopback, run the opt-in tests against them, stop them.

Used by ``make test-vllm``::

    .venv/bin/python tests/integration/run_vllm.py --vllm-python .tools/vllm-venv/bin/python \\
        --model .cache/tiny-llama -- -q -m vllm tests/integration

``--replicas 2`` (the default) starts two servers of the same model: the conformance tests use
the first (``SG_VLLM_URL``), the fleet-routing tests both (``SG_VLLM_URL_2``). Each replica gets
``--cpu-threads`` OpenMP threads (``VLLM_CPU_OMP_THREADS_BIND=nobind``: on a small shared machine
pinning cores per replica would make them wait for each other). vLLM runs fully offline
(``HF_HUB_OFFLINE=1``) with telemetry off (``VLLM_NO_USAGE_STATS=1``, ``DO_NOT_TRACK=1``) and a
1 GiB KV cache (``VLLM_CPU_KVCACHE_SPACE=1``). It is started with
``python -m vllm.entrypoints.openai.api_server`` because the ``vllm`` command fails on the
``vllm-cpu`` package metadata. The exit code is pytest's (2 when vLLM does not come up).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from engine_runner import Engine, free_port, serve_all_and_test

SERVED_NAME = "tiny"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--vllm-python", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True, help="model directory")
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    parser.add_argument("--log", type=Path, default=Path(".cache/vllm-server.log"))
    parser.add_argument("--replicas", type=int, default=2, help="vLLM servers to start")
    parser.add_argument("--cpu-threads", type=int, default=1, help="OpenMP threads per replica")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)

    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": str(args.cpu_threads),
    }
    engines: list[Engine] = []
    urls: list[str] = []
    events: list[tuple[str, str]] = []
    for i in range(args.replicas):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        # KV-cache events (tests/integration/test_vllm_kv_events.py): PUB + replay ROUTER.
        # vLLM binds its PUB socket only for an endpoint with "*" (else it connects); the
        # replay socket always binds.
        pub_port, replay = free_port(), f"tcp://127.0.0.1:{free_port()}"
        events.append((f"tcp://127.0.0.1:{pub_port}", replay))
        kv_events = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                                "endpoint": f"tcp://*:{pub_port}", "replay_endpoint": replay})
        cmd = [
            str(args.vllm_python), "-m", "vllm.entrypoints.openai.api_server",
            "--host", "127.0.0.1", "--port", str(port),
            "--model", str(args.model), "--served-model-name", SERVED_NAME,
            "--max-model-len", str(args.max_model_len), "--dtype", "float32",
            # named tool_choice needs a tool-call parser in vLLM >= 0.3x
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            "--kv-events-config", kv_events,
        ]
        log = args.log if i == 0 else args.log.with_stem(f"{args.log.stem}-{i + 1}")
        engines.append(Engine(f"vLLM replica {i + 1} on {url}", cmd, log, f"{url}/health"))
        urls.append(url)
    test_env = {"SG_VLLM_URL": urls[0], "SG_VLLM_MODEL": SERVED_NAME,
                "SG_VLLM_KV_EVENTS": events[0][0], "SG_VLLM_KV_REPLAY": events[0][1]}
    if len(urls) > 1:
        test_env["SG_VLLM_URL_2"] = urls[1]
    return serve_all_and_test(engines, env, args.startup_timeout_s, test_env,
                              args.pytest_args or ["-m", "vllm"], poll_s=1)


if __name__ == "__main__":
    sys.exit(main())
