"""Start llama.cpp's server (``llama-cpp-python[server]``) on loopback, run the opt-in
conformance tests against it, stop it.

Used by ``make test-llamacpp``::

    .venv/bin/python tests/integration/run_llamacpp.py \\
        --llamacpp-python .cache/llamacpp-venv/bin/python --model .cache/tiny-llama.gguf \\
        -- -q -m llamacpp tests/integration/test_llamacpp_conformance.py

The server runs as ``python -m llama_cpp.server`` with the model alias ``tiny``, a 512-token
context, one thread per request and nothing downloaded (the GGUF file is local). The exit code
is pytest's (2 when the server does not come up).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from engine_runner import free_port, serve_and_test

SERVED_NAME = "tiny"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--llamacpp-python", type=Path, required=True)
    parser.add_argument("--model", type=Path, required=True, help="GGUF file")
    parser.add_argument("--n-ctx", type=int, default=512)
    parser.add_argument("--startup-timeout-s", type=float, default=300.0)
    parser.add_argument("--log", type=Path, default=Path(".cache/llamacpp-server.log"))
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args(argv)
    if not args.model.is_file():
        print(f"run_llamacpp: --model {args.model}: no such file", file=sys.stderr)
        return 2

    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}
    cmd_server = [
        str(args.llamacpp_python), "-m", "llama_cpp.server",
        "--host", "127.0.0.1", "--port", str(port), "--model", str(args.model),
        "--model_alias", SERVED_NAME, "--n_ctx", str(args.n_ctx), "--n_threads", "1",
        "--seed", "0",
    ]
    url = f"http://127.0.0.1:{port}"
    return serve_and_test(
        f"llama.cpp server on {url}", cmd_server, env, args.log, f"{url}/v1/models",
        args.startup_timeout_s,
        {"SG_LLAMACPP_URL": url, "SG_LLAMACPP_MODEL": SERVED_NAME},
        args.pytest_args or ["-m", "llamacpp"], poll_s=0.5,
    )


if __name__ == "__main__":
    sys.exit(main())
