"""``vllm-sim``: serve the vLLM SIMULATOR with uvicorn.

Example::

    vllm-sim --port 8001 --model llama-sim --model embed-sim --ttft-ms 50 --itl-ms 10

The command line is the project's shared shell (:func:`clishell.run`, as ``gateway``,
``policy``, ``weights``, ``airgap``): help with command-line metavars, ``--version``,
``-v``/``--verbose``, one error line ``vllm-sim: error [CODE]: WHAT (hint: ...)``. Exit codes:
2 on a usage or start-up error; 130 after Ctrl-C (SIGINT) and 143 after SIGTERM, once uvicorn
has shut down gracefully (uvicorn re-raises the signal it caught; the shell's handler turns it
into the interrupted exit): a simulator never stops "successfully" by a signal.
"""

from __future__ import annotations

import enum
import json
import logging
import signal
import socket
import sys
from types import FrameType
from typing import Annotated

import typer
import uvicorn
from pydantic import ValidationError

from clishell import CliError, Interrupted, VerboseOpt, VersionOpt, run
from vllm_sim.app import create_app
from vllm_sim.config import SimConfig
from vllm_sim.profiles import ProfileError


class SchedulingPolicyOpt(enum.Enum):
    """``--scheduling-policy`` values (vLLM's names)."""

    FCFS = "fcfs"
    PRIORITY = "priority"


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
        list[str] | None, typer.Option(
            "--model", help="Served model name (repeatable). None given: sim-model.")
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
    kv_events_config: Annotated[
        str | None,
        typer.Option(help="With --profile: vLLM's --kv-events-config JSON (publish KV events)."),
    ] = None,
    scheduling_policy: Annotated[
        SchedulingPolicyOpt | None,
        typer.Option(help="vLLM's --scheduling-policy: fcfs, or priority (lower first); "
                          "default: the profile's (fcfs)."),
    ] = None,
    long_prefill_token_threshold: Annotated[
        int | None,
        typer.Option(min=0, help="With --profile: vLLM's --long-prefill-token-threshold "
                                 "(prompt tokens per request and step; 0: no cap)."),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(help="vLLM's --api-key: /v1 requests need 'Authorization: Bearer KEY' "
                          "(else 401). Default: the VLLM_API_KEY environment variable, as vLLM.",
                     envvar="VLLM_API_KEY", show_envvar=False),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "warning",
    access_log: Annotated[bool, typer.Option(help="Log every request.")] = False,
    version: VersionOpt = False,
    verbose: VerboseOpt = False,
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
        kv_events=None if kv_events_config is None else json.loads(kv_events_config),
        scheduling_policy=None if scheduling_policy is None else scheduling_policy.value,
        long_prefill_token_threshold=long_prefill_token_threshold,
        api_key=api_key or None,
    )
    server = _Server(uvicorn.Config(
        create_app(config),
        host=host,
        port=port,
        loop="asyncio",
        http="h11",
        lifespan="on",
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=2,
    ))
    server.banner = (f"model{'s' if len(config.models) > 1 else ''} "
                     f"{', '.join(config.models)}, profile "
                     f"{config.profile or 'none (fixed --ttft-ms/--itl-ms)'}")
    try:
        server.run()
    except SystemExit as exc:  # uvicorn: the port could not be bound (it logged why)
        raise _cannot_serve(host, port) from exc
    except Interrupted as exc:  # the signal uvicorn re-raised after its graceful shutdown
        raise _stopped(exc.signum) from None
    if server.stopped_by is not None:
        # uvicorn re-raised the signal after its shutdown; an inherited "ignore" (a background
        # job's SIGINT) swallowed it, but the server did stop because of it.
        raise _stopped(server.stopped_by)
    if not server.started:
        raise _cannot_serve(host, port)


def _stopped(signum: int) -> Interrupted:
    """The interrupted exit of a simulator that a signal stopped (a server: nothing to resume,
    so not the shell's default "rerun the command to resume")."""
    name = signal.Signals(signum).name
    return Interrupted(signum, f"interrupted by {name}; the simulator shut down",
                       hint="a signal is how the simulator stops; its exit status "
                            f"{128 + signum} says which")


class _Server(uvicorn.Server):
    """uvicorn's server, remembering the first signal that stopped it."""

    stopped_by: int | None = None
    #: What it serves, for the line printed once it listens (models, profile).
    banner: str = ""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """Start listening, then say so in one line on standard error (stdout stays clean).

        At the default log level (warning) uvicorn prints nothing once it listens: an operator
        could not tell the simulator was up, nor on which address (``--port 0`` picks one).
        """
        await super().startup(sockets)
        if not self.started:
            return
        bound = [sock.getsockname() for server in self.servers for sock in server.sockets]
        urls = ", ".join(f"http://[{a[0]}]:{a[1]}" if ":" in str(a[0]) else
                         f"http://{a[0]}:{a[1]}" for a in bound
                         if isinstance(a, tuple))  # a Unix socket's name is a str
        print(f"vllm-sim: listening on {urls or '(no TCP address)'} (simulator, not a real "
              f"vLLM): {self.banner}; Ctrl-C stops it", file=sys.stderr, flush=True)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.stopped_by is None:
            self.stopped_by = sig
        super().handle_exit(sig, frame)


def _cannot_serve(host: str, port: int) -> CliError:
    return CliError("cannot_serve", f"the server did not start on {host}:{port} (see the log "
                    "line above)", hint="choose a free --port")


#: The command-line option of each :class:`SimConfig` field the options fill in.
_OPTION = {"models": "--model", "ttft_s": "--ttft-ms", "itl_s": "--itl-ms",
           "tokens_per_response": "--tokens", "max_model_len": "--max-model-len",
           "embedding_dim": "--embedding-dim", "profile": "--profile",
           "time_scale": "--time-scale", "num_gpu_blocks": "--num-gpu-blocks",
           "kv_events": "--kv-events-config"}


def _describe(exc: BaseException) -> CliError | None:
    """The simulator's invalid options as usage errors (exit 2)."""
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "?"
        return CliError("invalid_option",
                        f"invalid option {_OPTION.get(field, field)} ({field}): {err['msg']}",
                        hint="see 'vllm-sim --help'")
    if isinstance(exc, ProfileError):
        return CliError("invalid_profile", f"invalid --profile: {exc}",
                        hint="a profile name of docs/simulator.md or a profile .json file")
    return None


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point: the shared CLI boundary (:func:`clishell.run`).

    Returns:
        2 on a usage error or when the server cannot start; 130 / 143 when SIGINT / SIGTERM
        stopped it (after its graceful shutdown).
    """
    logging.basicConfig(level=logging.WARNING)
    return run(app, argv, prog="vllm-sim", describe=_describe)


if __name__ == "__main__":
    sys.exit(main())
