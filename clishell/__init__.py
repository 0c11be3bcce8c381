"""The one command-line shell of ``gateway``, ``policy``, ``weights`` and ``airgap``.

A small leaf package: it imports none of the project's packages, and all four may import it
(import-linter contracts in ``pyproject.toml``). Public API::

    run(app, argv, prog=..., describe=..., runner=..., setup=...) -> int
                               the error boundary of every main(): one error line, exit codes,
                               SIGINT/SIGTERM/SIGHUP -> cleanup -> 130/143/129
    invoke(app, args, prog)    parse and run with help metavars (for a fast path's fallback)
    CliError                   a failure with code, message, hint, exit code
    error_line, warn           ``PROG: error [CODE]: WHAT (hint: ...)`` / ``warning [CODE]``
    EXIT_OK, EXIT_FAILED, EXIT_USAGE                  0, 1, 2
    VersionOpt, VerboseOpt, VERSION                   the shared root options
    ConfigOpt, require_config, CONFIG_ENV             --config/-c/$SG_CONFIG, one definition
    Interrupted, interruptible, die_by                SIGINT/SIGTERM/SIGHUP -> cleanup -> 130/143
    wait_for, WAKE_S                                  wait on another thread, signals still run
    wait_out                                          the cleanup wait: through later signals
    public_key_path, existing_public_key              key file names: KEY.pem and KEY.pub
    private_key_instead                               a private key given where a public one goes
    UNSAFE_TEXT, shown                                untrusted text on a terminal: escaped
    atomic_file, write_atomic                         an output file complete or absent
    read_input, read_input_text                       an input file (or pipe) read so that a
                                                      signal meanwhile is never lost
    not_regular                                       a pipe/FIFO where a file is read twice
"""


from typing import TYPE_CHECKING, Any

from clishell.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, error_line, warn
from clishell.files import atomic_file, write_atomic
from clishell.inputs import not_regular, read_input, read_input_text
from clishell.interrupt import WAKE_S, Interrupted, die_by, interruptible, wait_for, wait_out
from clishell.keyfiles import existing_public_key, private_key_instead, public_key_path
from clishell.text import UNSAFE_TEXT, shown

if TYPE_CHECKING:
    from clishell.boundary import BUG_HINT, IO_HINT, invoke, run, shared_flags
    from clishell.options import (
        CONFIG_ENV,
        VERSION,
        ConfigOpt,
        VerboseOpt,
        VersionOpt,
        click_command,
        require_config,
        version_line,
    )

# typer costs ~0.15 CPU-s to import: the library users of the key file names
# (airgap.signing, weights.signing, gateway.audit) and the typer-free fast path of
# `airgap verify` load the boundary and the typer options only when they use them.
_LAZY = {
    "BUG_HINT": "clishell.boundary", "IO_HINT": "clishell.boundary",
    "invoke": "clishell.boundary", "run": "clishell.boundary", "shared_flags": "clishell.boundary",
    "CONFIG_ENV": "clishell.options", "ConfigOpt": "clishell.options",
    "require_config": "clishell.options",
    "VERSION": "clishell.options", "VerboseOpt": "clishell.options",
    "VersionOpt": "clishell.options", "click_command": "clishell.options",
    "version_line": "clishell.options",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'clishell' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)

__all__ = [
    "BUG_HINT",
    "CONFIG_ENV",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "IO_HINT",
    "UNSAFE_TEXT",
    "VERSION",
    "WAKE_S",
    "CliError",
    "ConfigOpt",
    "Interrupted",
    "VerboseOpt",
    "VersionOpt",
    "atomic_file",
    "click_command",
    "die_by",
    "error_line",
    "existing_public_key",
    "interruptible",
    "invoke",
    "not_regular",
    "private_key_instead",
    "public_key_path",
    "read_input",
    "read_input_text",
    "require_config",
    "run",
    "shared_flags",
    "shown",
    "version_line",
    "wait_for",
    "wait_out",
    "warn",
    "write_atomic",
]
