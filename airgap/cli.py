"""``airgap`` command line: keygen, pack, verify, unpack, inspect, oci-export, oci-verify.

Each command parses, calls the public API and renders. ``main()`` is the shared error boundary
(:func:`clishell.run`): exit 0 ok, 1 verification failed (bundle, signature or content not
trusted), 2 usage or I/O, 128 + signal when interrupted; ``-v``/``--verbose`` shows tracebacks.

Start-up cost matters for ``airgap verify`` (docs/airgap.md, "Measured performance"): this
module holds the entry point, the rendering helpers and ``verify``'s implementation, and
imports neither typer nor rich; a plain ``verify`` command line is parsed here
(:func:`_fast_verify_args`), everything else goes to the typer application in
:mod:`airgap.cli_app` (``airgap.cli.app``). pack, unpack, the ML-BOM writer and the private-key
code load only in the commands that use them, and rich is imported on first use
(:mod:`clishell.consoles`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airgap.bundle import INDEX_NAME, MAX_INDEX_BYTES
from airgap.errors import AirgapError, Code, Problem, VerificationFailed
from airgap.media import check_bundle_dir, read_small
from airgap.signing import load_public_key
from airgap.stream import default_workers
from airgap.verify import MAX_SHOWN_PROBLEMS, problems_json, verify_bundle
from clishell import EXIT_FAILED, CliError, existing_public_key, invoke, run
from clishell.consoles import byte_progress, diagnostics, results
from weights import EmptyModelError, Lockfile, PathCollisionError, WeightsError

if TYPE_CHECKING:
    from rich.console import Console


def err() -> Console:
    """The console on standard error (progress, diagnostics); rich is imported on first use."""
    return diagnostics()


def out() -> Console:
    """The console on standard output (results); rich is imported on first use."""
    return results()


def _progress(total: int, label: str, quiet: bool) -> contextlib.AbstractContextManager[Any]:
    """A byte-count callback drawing a rich progress bar (none if quiet or not a TTY)."""
    return byte_progress(total, label, quiet)


def _styled_stdout() -> bool:
    """Whether rich would style standard output (its ``Console.is_terminal`` rules).

    ``TTY_COMPATIBLE`` 0/1, then ``FORCE_COLOR`` (https://force-color.org/: set and not empty),
    then ``isatty()``.
    """
    tty_compatible = os.environ.get("TTY_COMPATIBLE", "")
    if tty_compatible in ("0", "1"):
        return tty_compatible == "1"
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None:
        return force_color != ""
    try:
        return sys.stdout.isatty()
    except ValueError:  # closed
        return False


def _print_json(doc: dict[str, Any]) -> None:
    """Print a JSON document indented by 2, as rich's ``print_json`` does; plain (rich not
    loaded) unless standard output is a terminal that gets highlighting."""
    if _styled_stdout():
        out().print_json(json.dumps(doc))
    else:
        sys.stdout.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def _print_line(text: str) -> None:
    """Print one result line; plain (rich not loaded, paths exactly as they are, no
    ``:emoji:`` codes replaced) unless standard output is a terminal that gets highlighting."""
    if _styled_stdout():
        out().print(text)
    else:
        sys.stdout.write(text + "\n")


def _load_lock(path: Path | None) -> Lockfile | None:
    if path is None:
        return None
    try:
        return Lockfile.load(path)
    except PathCollisionError as exc:
        raise AirgapError(Code.PATH_COLLISION, exc.message) from exc
    except EmptyModelError as exc:
        raise AirgapError(Code.EMPTY_MODEL, exc.message) from exc
    except WeightsError as exc:
        raise AirgapError(Code.LOCK_INVALID, str(exc)) from exc


def _trusted_keys(paths: Sequence[Path]) -> list[Any]:
    """Load the ``--public-key`` files (an old ``KEY.pub.pem`` name is still found)."""
    return [load_public_key(existing_public_key(p, "airgap")) for p in paths]


def _workers(n: int) -> int:
    return n or default_workers()


def _peek_payload(bundle: Path) -> int:
    """Payload size from an (unverified) index, for the progress bar only.

    A scan for the one field, not a JSON parse: the index is not trusted yet, and parsing a
    hostile 40 MB index would cost more than refusing it does (docs/airgap.md)."""
    try:
        data = read_small(bundle, INDEX_NAME, MAX_INDEX_BYTES, Code.INDEX_MISSING)
    except VerificationFailed:
        return 0
    found = re.search(rb'"payload_size"\s*:\s*(\d{1,19})', data)
    return int(found.group(1)) if found else 0


def _shows_progress(quiet: bool) -> bool:
    return not quiet and err().is_terminal


def run_verify(
    bundle: Path,
    public_key: Sequence[Path],
    expected_lock: Path | None = None,
    all_parts: bool = False,
    as_json: bool = False,
    workers: int = 0,
    quiet: bool = False,
) -> int:
    """``airgap verify``: check a bundle offline and print the report (see the command's help).

    Args:
        bundle: Bundle directory.
        public_key: Trusted Ed25519 public key files.
        expected_lock: Also require the bundle's pins to equal this lockfile.
        all_parts: Also hash every part whole.
        as_json: Print the JSON report instead of the text lines.
        workers: Hashing threads (0 = one per core).
        quiet: No progress bar.

    Returns:
        0 if the bundle is trusted, else 1 (its problems printed).

    Raises:
        AirgapError: An unreadable key, bundle directory or lockfile (exit 2).
    """
    keys = _trusted_keys(public_key)
    check_bundle_dir(bundle)
    total = _peek_payload(bundle) if _shows_progress(quiet or as_json) else 0
    with _progress(total, "verifying", quiet or as_json) as progress:
        report = verify_bundle(bundle, keys, expected_lock=_load_lock(expected_lock),
                               workers=_workers(workers), all_parts=all_parts,
                               progress=progress)  # fmt: skip
    if as_json:
        _print_json(report.to_json())
    elif report.ok:
        rate = report.bytes_hashed / max(report.seconds, 1e-9) / 1024**3
        _print_line(f"OK {bundle}: signed by {report.signer}, {report.bytes_hashed} bytes "
                    f"verified in {report.seconds:.1f} s ({rate:.2f} GiB/s)")  # fmt: skip
    else:
        _print_problems(report.problems, "FAIL ")
    return 0 if report.ok else EXIT_FAILED




def _print_problems(problems: Sequence[Problem], prefix: str) -> None:
    """The first ``MAX_SHOWN_PROBLEMS`` problems, one line each, then how many more."""
    for p in problems[:MAX_SHOWN_PROBLEMS]:
        err().print(f"{prefix}{p.code}: {p.message}{_detail(p)}", markup=False, highlight=False)
    if len(problems) > MAX_SHOWN_PROBLEMS:
        err().print(f"{prefix}... and {len(problems) - MAX_SHOWN_PROBLEMS} more problem(s) "
                  f"({len(problems)} in all; fix these first)", markup=False, highlight=False)


def _detail(p: Problem) -> str:
    """`` (expected X, got Y)`` unless the message already says so."""
    if p.expected is None or p.expected in p.message:
        return ""
    return f" (expected {p.expected}, got {p.actual})"


#: `airgap verify` options the fast parser takes: option -> (parameter, takes a value,
#: repeatable). Kept equal to the typer command's by tests/airgap/test_cli_startup.py.
_VERIFY_OPTIONS: dict[str, tuple[str, bool, bool]] = {
    "--public-key": ("public_key", True, True),
    "-k": ("public_key", True, True),
    "--lock": ("expected_lock", True, False),
    "--all-parts": ("all_parts", False, False),
    "--json": ("as_json", False, False),
    "--workers": ("workers", True, False),
    "--quiet": ("quiet", False, False),
    "-q": ("quiet", False, False),
}


def _fast_verify_args(args: Sequence[str]) -> dict[str, Any] | None:
    """Keyword arguments of ``verify`` for a plain, well-formed ``verify`` command line.

    typer's parser builds a pydantic TypeAdapter per parameter on first use, which costs about
    0.25 CPU-s of start-up (pydantic's import) on every ``airgap verify``, and importing typer
    itself about 0.15 CPU-s more. This parser takes
    only the unambiguous forms (``--opt VALUE``, ``--opt=VALUE``, ``-k VALUE``, flags, one
    bundle argument) and returns None for anything else (help, unknown or repeated options,
    ``--``, bundled short flags, a bad number, a missing key), which then goes through typer
    as before, so every error message and exit code stays typer's.

    Args:
        args: The command line after the program name, ``--verbose`` already removed.

    Returns:
        The keyword arguments for :func:`run_verify`, or None to let typer parse.
    """
    if not args or args[0] != "verify":
        return None
    kwargs: dict[str, Any] = {"public_key": [], "expected_lock": None, "all_parts": False,
                              "as_json": False, "workers": 0, "quiet": False}
    bundle: Path | None = None
    seen: set[str] = set()
    rest = list(args[1:])
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("-") and arg:
            if bundle is not None:
                return None
            bundle = Path(arg)
            continue
        name, eq, inline = arg.partition("=")
        spec = _VERIFY_OPTIONS.get(name)
        if spec is None or (eq and (not spec[1] or not name.startswith("--"))):
            return None
        param, takes_value, repeatable = spec
        if param in seen and not repeatable:
            return None
        seen.add(param)
        if not takes_value:
            kwargs[param] = True
            continue
        if eq:
            value = inline
        elif rest and not rest[0].startswith("-"):
            value = rest.pop(0)
        else:
            return None
        if not value:
            return None
        if param == "workers":
            if not value.isascii() or not value.isdigit():
                return None
            kwargs[param] = int(value)
        elif param == "public_key":
            kwargs[param].append(Path(value))
        else:
            kwargs[param] = Path(value)
    if bundle is None or not kwargs["public_key"]:
        return None
    kwargs["bundle"] = bundle
    return kwargs


def _run(args: list[str]) -> Any:
    """Run one command: ``verify`` through the fast parser when it can (typer is then never
    imported), else through the typer application."""
    fast = _fast_verify_args(args)
    if fast is None:
        from airgap.cli_app import app

        return invoke(app, args, "airgap")
    return run_verify(**fast)


def _describe(exc: BaseException) -> CliError | None:
    """A bundle that is not trusted: one error line per problem (the first
    ``MAX_SHOWN_PROBLEMS``), exit 1, and the problems in the ``--json`` document."""
    if not isinstance(exc, VerificationFailed):
        return None
    shown = [(p.code, f"{p.message}{_detail(p)}") for p in exc.problems[:MAX_SHOWN_PROBLEMS]]
    omitted = len(exc.problems) - len(shown)
    if omitted:
        shown.append(("verification_failed", f"... and {omitted} more problem(s) "
                      f"({len(exc.problems)} in all; fix these first)"))
    (code, message), *more = shown
    return CliError(code, message, exit_code=EXIT_FAILED, more=tuple(more),
                    document={"ok": False, **problems_json(exc.problems)})


def main(argv: list[str] | None = None) -> int:
    """Entry point: the shared CLI boundary (:func:`clishell.run`); returns the exit code."""
    return run(None, argv, prog="airgap", describe=_describe, runner=_run)


def __getattr__(name: str) -> Any:
    """``airgap.cli.app``: the typer application, imported on first use."""
    if name == "app":
        from airgap.cli_app import app

        return app
    raise AttributeError(f"module 'airgap.cli' has no attribute {name!r}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
