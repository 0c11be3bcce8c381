"""``vllm-sim``: serve the vLLM SIMULATOR with uvicorn.

Example::

    vllm-sim --port 8001 --model llama-sim --model embed-sim --ttft-ms 50 --itl-ms 10

Exit codes: 0 after a clean shutdown, 2 on a usage or start-up error.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer
import uvicorn
from pydantic import ValidationError

from vllm_sim.app import create_app
from vllm_sim.config import SimConfig
from vllm_sim.profiles import ProfileError

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Serve the vLLM simulator (not a real vLLM).",
)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port to bind.")] = 8001,
    model: Annotated[
        list[str] | None, typer.Option("--model", help="Served model name (repeatable).")
    ] = None,
    ttft_ms: Annotated[float, typer.Option(help="Time to first token, milliseconds.")] = 0.0,
    itl_ms: Annotated[float, typer.Option(help="Inter-token latency, milliseconds.")] = 0.0,
    tokens: Annotated[int, typer.Option(help="Tokens generated per response.")] = 16,
    max_model_len: Annotated[int, typer.Option(help="Context length in tokens.")] = 2048,
    embedding_dim: Annotated[int, typer.Option(help="Embedding vector length.")] = 8,
    profile: Annotated[
        str | None,
        typer.Option(help="Engine model: a profile name (e.g. llama-3.1-8b-h100) or a .json file."),
    ] = None,
    time_scale: Annotated[
        float, typer.Option(help="With --profile: wall-clock seconds per model second.")
    ] = 1.0,
    num_gpu_blocks: Annotated[
        int | None, typer.Option(help="With --profile: override the KV-cache size in blocks.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
    access_log: Annotated[bool, typer.Option(help="Log every request.")] = False,
) -> None:
    """Serve the simulator until interrupted."""
    config = SimConfig(
        models=model or ["sim-model"],
        ttft_s=ttft_ms / 1000.0,
        itl_s=itl_ms / 1000.0,
        tokens_per_response=tokens,
        max_model_len=max_model_len,
        embedding_dim=embedding_dim,
        profile=profile,
        time_scale=time_scale,
        num_gpu_blocks=num_gpu_blocks,
    )
    uvicorn.run(
        create_app(config),
        host=host,
        port=port,
        loop="asyncio",
        http="h11",
        lifespan="on",
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=2,
    )


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; the one error boundary of the CLI.

    Returns:
        0 after a clean shutdown, 2 on a usage error or when the server cannot start.
    """
    logging.basicConfig(level=logging.WARNING)
    try:
        app(args=argv, prog_name="vllm-sim")
    except SystemExit as exc:  # typer/click: 0 on success, 2 on usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except ValidationError as exc:
        err = exc.errors()[0]
        print(f"vllm-sim: invalid option {err['loc'][0]}: {err['msg']}", file=sys.stderr)
        return 2
    except ProfileError as exc:
        print(f"vllm-sim: invalid --profile: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"vllm-sim: cannot serve: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
